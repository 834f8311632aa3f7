"""The REST routes other than infer, grouped by what they serve: :mod:`.health` (liveness,
readiness, server metadata, ``/metrics``), :mod:`.models` (model metadata, readiness,
configuration, statistics), :mod:`.repository` (the repository API) and :mod:`.predict`
(plain-JSON ``/predict``).  :func:`tierserve.server.http.rest.build_router` adds them."""
