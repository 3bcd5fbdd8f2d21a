"""Texts to raw vectors: the encoder, its poolings, the static table, the ONNX runtime.

Owns loading a model (a Hugging Face id, a local directory, a Model2Vec directory or the bundled
all-MiniLM-L6-v2), tokenising, pooling, the model's content hash, and checking an encoder
against the fields an index recorded for it. Nothing here knows about indexes: a caller passes
the recorded fields as a plain mapping (:func:`flowsearch.encode.encoder.open_encoder`).

Modules, from the bottom: ``options`` (names and checks), ``model_files`` (where a model is, its
config as JSON, its content hash), ``tokens`` (``tokenizers``, else ``transformers``),
``static`` (the table lookup), ``pooling``, ``torch_runner``, ``onnx`` (cached graphs and their
sessions) and ``onnx_export`` (writing them), ``loading`` (a model's parts), ``identity``
(recorded fields), ``encoder`` (:class:`~flowsearch.encode.encoder.Encoder`), ``protocol``
(:class:`~flowsearch.encode.protocol.TextEncoder`: what the rest of the package calls on one).

``torch`` and ``transformers`` are imported only where a model runs in torch or is exported:
a local model's ``static`` pooling and a cached ONNX graph need neither (docs/ENCODERS.md).

May import: ``flowsearch.errors``, ``flowsearch.progress``,
``flowsearch.atomic``.
"""

from flowsearch.encode.protocol import TextEncoder

__all__ = ["TextEncoder"]
