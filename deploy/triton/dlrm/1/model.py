"""A Triton Python-backend model that runs tierserve's inference stack inside tritonserver.

config.pbtxt parameters:

- ``ps_config``: the ``ps.json`` whose entry named like this Triton model gives the graph
  JSON, dense file, sparse folders and storage tiers (relative paths: against the file);
- ``site_packages`` (optional): a site-packages folder holding tierserve, added with
  ``site.addsitedir`` because the backend's stub does not see the virtual environment.

Inputs and outputs are tierserve's (DESIGN.md, Requests): ``DES``, ``CATCOLUMN`` [,
``ROWINDEX``] -> ``OUTPUT0`` for a model with a graph, ``KEYS``, ``NUMKEYS`` -> ``OUTPUT0`` for
an embedding-lookup model.  The requests of one ``execute`` call run as one merged batch.
"""

import json
import site

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if parameters.get("site_packages"):
            site.addsitedir(parameters["site_packages"])
        from tierserve.ps.config import load_ps_config
        from tierserve.server.loader import RepositoryLoader

        self.loader = RepositoryLoader()
        name = args["model_name"]
        self.servable = self.loader(
            name, args.get("model_version", "1"), None, load_ps_config(parameters["ps_config"])
        )
        self.input_names = [t.name for t in self.servable.inputs]

    def execute(self, requests):
        from tierserve.ps.errors import TierserveError

        responses = [None] * len(requests)
        units, owners = [], []
        for i, request in enumerate(requests):
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            try:
                self.servable.check(inputs)
                units.append(self.servable.prepare(inputs))
                owners.append(i)
            except TierserveError as exc:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.message))
        if units:
            batched = self.servable.max_batch_size > 0 and len(units) > 1
            results = (
                self._split(self.servable.execute(self.servable.merge(units)), units)
                if batched
                else [self.servable.execute(u) for u in units]
            )
            for i, outputs in zip(owners, results):
                tensors = [pb_utils.Tensor(n, a) for n, a in outputs.items()]
                responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
        return responses

    @staticmethod
    def _split(outputs, units):
        import numpy as np

        cuts = np.cumsum([u.batch_size for u in units])[:-1]
        parts = {n: np.split(a, cuts) for n, a in outputs.items()}
        return [{n: p[i] for n, p in parts.items()} for i in range(len(units))]

    def finalize(self):
        self.servable.close()
        self.loader.close()
