"""Texts to raw vectors: the encoder, its poolings, the static table, the ONNX runtime.

Owns loading a model (a Hugging Face id, a local directory or the bundled all-MiniLM-L6-v2),
tokenising, pooling and the model's content hash. May import: ``flowsearch.errors``,
``flowsearch.settings``, ``flowsearch.progress``. Nothing here knows about indexes.
"""
