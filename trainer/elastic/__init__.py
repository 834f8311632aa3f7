"""DLRover's Estimator trainer pieces (``dlrover.trainer.tensorflow``) on tierserve's trainer.

``Column`` describes a record field, readers give records (``ElasticReader`` by index range,
``FileReader`` over a text file, any object with ``iterator()``), a conf's data sets become
input_fns (:func:`build_input_fn`), a :class:`ShardDispatcher` hands index ranges out in
shards, and ``tierserve train --conf module.TrainConf`` (:mod:`.entry`, also ``python -m
tierserve.trainer.elastic``) runs a conf; ``default_logger`` stands for DLRover's
``dlrover.trainer.util.log_util.default_logger``.
"""

from .column import Column
from .hooks import ElasticDataShardReportHook, ReportModelInfoHook
from .input_fn import build_input_fn, check_data_set
from .log_util import default_logger
from .readers import ElasticReader, FileReader
from .sharding import Shard, ShardDispatcher, ShardingClient

__all__ = [
    "Column",
    "ElasticDataShardReportHook",
    "ElasticReader",
    "FileReader",
    "ReportModelInfoHook",
    "Shard",
    "ShardDispatcher",
    "ShardingClient",
    "build_input_fn",
    "check_data_set",
    "default_logger",
]
