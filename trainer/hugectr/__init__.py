"""HugeCTR's Python API (``import hugectr``) over the trainer's engines: the solver and
session objects, the layer specs a ``Model`` is built from, the MLPerf parameters, ``tools``
(the data generator) and ``inference`` (HugeCTR's inference API over the server).

Users reach these names as ``import tierserve.trainer as hugectr``; this sub-package keeps the
facade apart from the engines it calls, and it is the only part of the trainer that imports
the server (:mod:`.inference`).
"""
