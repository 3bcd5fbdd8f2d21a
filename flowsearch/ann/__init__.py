"""Vector indexes (FAISS): choosing a factory, building, tuning, reading, searching.

Owns every call into FAISS: ``auto``'s choice of index by size (``factory``, under an
``AnnPolicy``: ``policy``), training and filling (``build``), the recall tuning (``tune``,
``merged``), the pre-filter that searches only allowed rows, the on-disk IVF merge and the GPU
path. Works on arrays and paths it is given; may import only the base modules.
"""
