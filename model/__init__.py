"""A trained model as the trainer writes it and the server runs it: the graph JSON
(:mod:`.graph_json`), the dense and served weight files, the manifest and version folders, the
layers and their forward pass (:mod:`.inference_graph`, :mod:`.network`), the batch a model
reads (:mod:`.batch`) and embedding pooling (:mod:`.combine`).

It sits below both the server and the trainer, which share it; it imports neither.
"""
