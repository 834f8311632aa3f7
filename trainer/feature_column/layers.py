"""``DenseFeatures`` / ``input_layer`` and ``linear_model``: feature columns into the graph a
``model_fn`` builds.

Dense columns (numeric, bucketized, indicator) become a ``Slice`` of the dense input; the
embedding columns of one call with the same settings share one table, a slot per column, and
become a ``Reshape`` of its output.  The result concatenates the columns sorted by name, as
TensorFlow does (columns next to each other in that order and in one table are read by one
``Reshape``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from tierserve.core.compat import warn_once
from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.tensors import (
    DENSE,
    FeatureTensor,
    Graph,
    SparseGroup,
    Tensor,
    WeightedInput,
    current_graph,
)

from . import options as emb_options
from .columns import (
    CategoricalColumn,
    DenseColumn,
    EmbeddingColumn,
    FeatureColumn,
    IndicatorColumn,
    WeightedCategoricalColumn,
    numeric_column,
)


def table_name(graph: Graph, base: str) -> str:
    """A unique table name the parameter server accepts (``[A-Za-z0-9_-]{1,120}``)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", graph.unique(base).replace("/", "-"))
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:16]
    return name


def _check_features(features: Any, columns: list[FeatureColumn], what: str) -> None:
    if not isinstance(features, dict):
        raise ConfigError(f"{what}: features must be the dict model_fn received")
    for col in columns:
        for key in col.input_keys:
            if key not in features:
                from tierserve.core.errors import InvalidInputError

                raise InvalidInputError(
                    f"feature column {col.name!r} needs feature {key!r}, which the input_fn "
                    f"does not provide (it gives: {', '.join(sorted(map(str, features)))})")


def _columns(feature_columns: Any, what: str) -> list[FeatureColumn]:
    if isinstance(feature_columns, FeatureColumn):
        feature_columns = [feature_columns]
    cols = [numeric_column(c.key) if isinstance(c, FeatureTensor) else c
            for c in (feature_columns or [])]
    if not cols:
        raise ConfigError(f"{what}: feature_columns is empty")
    for c in cols:
        if not isinstance(c, FeatureColumn):
            raise ConfigError(f"{what}: {c!r} is not a feature column")
    names = [c.name for c in cols]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{what}: duplicate feature columns {dup}")
    return sorted(cols, key=lambda c: c.name)


def _slices(g: Graph, columns: list[DenseColumn]) -> dict[str, Tensor]:
    """One Slice of the dense input for these columns: a tensor per column name."""
    if not columns:
        return {}
    pieces = [g.dense_piece(c) for c in columns]
    lname = g.unique("input_layer/slice")
    tops = [f"{lname}:{i}" for i in range(len(pieces))]
    layer = {"name": lname, "type": "Slice", "bottom": DENSE, "top": tops,
             "ranges": [[p.offset, p.offset + p.width] for p in pieces]}
    outs = g.add_layer(layer, tops, [(p.width,) for p in pieces])
    return {c.name: t for c, t in zip(columns, outs)}


def _group_key(col: EmbeddingColumn, dim: int, combiner: str, options: dict, call: int,
               scope: str) -> Any:
    if col.shared_name:
        return ("shared", col.shared_name)
    return (call, scope, dim, combiner, id(col.initializer), col.max_norm, col.trainable,
            str(options.get("emb_device") or ""))


def _lookup_groups(g: Graph, cols: list[EmbeddingColumn], call_options: dict, call: int,
                   linear_units: int | None = None, combiner: str | None = None
                   ) -> list[tuple[SparseGroup, list[int]]]:
    """Add ``cols`` to their tables; returns each table with the slots this call reads."""
    used: dict[str, tuple[SparseGroup, list[int]]] = {}
    order: list[str] = []
    for col in cols:
        options = emb_options.resolve(col.name, col.options, call_options)
        dim = linear_units or col.dimension
        comb = combiner or col.combiner
        key = _group_key(col, dim, comb, options, call, g.current_scope)
        cat = col.categorical_column

        def make(col=col, dim=dim, comb=comb, options=options, cat=cat):
            base = (f"{col.shared_name}" if col.shared_name
                    else f"input_layer/{col.name}" if linear_units is None
                    else f"linear_model/{cat.name}")
            return SparseGroup(
                table=table_name(g, base), columns=[], offsets=[], dim=dim, combiner=comb,
                optimizer_scope=g.current_scope, init=col.initializer,
                init_scale=0.0 if linear_units is not None else None, max_norm=col.max_norm,
                trainable=col.trainable, device=str(options.get("emb_device") or ""))

        group = g.sparse_group(key, make)
        group.shared = bool(col.shared_name)  # type: ignore[attr-defined]
        names = [c.name for c in group.columns]
        if cat.name in names and (col.shared_name or linear_units is not None
                                  or group.columns[names.index(cat.name)] is cat):
            slot = names.index(cat.name)
        else:
            offset = 0 if col.shared_name or not group.columns else group.rows
            group.columns.append(cat)
            group.offsets.append(offset)
            suffix = "weights" if linear_units is not None else "embedding_weights"
            label = col.shared_name or (cat.name if linear_units is not None else col.name)
            group.display_names.append(g.scoped(
                f"{'linear_model' if linear_units is not None else 'input_layer'}/"
                f"{label}/{suffix}"))
            slot = len(group.columns) - 1
            g.used_features.update(cat.input_keys)
        g.shapes[group.table] = (group.slot_num, group.dim)
        if group.table not in used:
            used[group.table] = (group, [])
            order.append(group.table)
        used[group.table][1].append(slot)
    return [used[t] for t in order]


def _weighted_input(g: Graph, col: EmbeddingColumn, dim: int, combiner: str, options: dict,
                    zero_init: bool) -> Tensor:
    name = table_name(g, f"input_layer/{col.name}")
    if emb_options.gpu_requested(options):
        warn_once("emb_device", "a weighted categorical column's table stays in host "
                         "memory")
    w = WeightedInput(name=name, table=name, column=col.categorical_column, dim=dim,
                      combiner=combiner)
    w.zero_init = zero_init  # type: ignore[attr-defined]
    w.init = col.initializer  # type: ignore[attr-defined]
    w.display_name = g.scoped(f"input_layer/{col.name}/embedding_weights")  # type: ignore
    g.weighted.append(w)
    g.shapes[name] = (dim,)
    g.used_features.update(col.categorical_column.input_keys)
    return Tensor(g, name, (dim,))


def _whole(group: SparseGroup, slots: list[int]) -> bool:
    """Whether ``slots`` are all of a table private to this call, in order (then a plain
    reshape, no copy, reads them); a shared table may gain slots later."""
    return slots == list(range(group.slot_num)) and not getattr(group, "shared", False)


def _reshape_slots(g: Graph, group: SparseGroup, slots: list[int]) -> Tensor:
    lname = g.unique(f"input_layer/{group.table}_reshape")
    layer = {"name": lname, "type": "Reshape", "bottom": group.table, "top": lname}
    if _whole(group, slots):
        layer["leading_dim"] = len(slots) * group.dim
    else:
        layer["selected"] = list(slots)
    return g.add_layer(layer, [lname], [(len(slots) * group.dim,)])[0]


def _concat(g: Graph, parts: list[Tensor], name: str) -> Tensor:
    if len(parts) == 1:
        return parts[0]
    lname = g.unique(name)
    layer = {"name": lname, "type": "Concat", "bottom": [p.name for p in parts], "top": lname}
    return g.add_layer(layer, [lname], [(sum(p.width for p in parts),)])[0]


def build_dense_features(features: Any, feature_columns: Any, options: dict | None = None,
                         what: str = "DenseFeatures") -> Tensor:
    """The ``[batch, width]`` tensor of ``feature_columns`` in the current graph."""
    g = current_graph(what)
    cols = _columns(feature_columns, what)
    _check_features(features, cols, what)
    call_options = emb_options.check_options(dict(options or {}), what)
    for i, c in enumerate(cols):
        if isinstance(c, CategoricalColumn) and not isinstance(c, DenseColumn):
            warn_once(f"{what} categorical column {c.name!r}",
                             f"read as indicator_column({c.name!r}) (one-hot); wrap it in "
                             "indicator_column or embedding_column to say which")
            cols[i] = IndicatorColumn(c)
    cols.sort(key=lambda c: c.name)
    dense_cols = [c for c in cols if isinstance(c, DenseColumn)]
    emb_cols = [c for c in cols if isinstance(c, EmbeddingColumn) and not c.weighted]
    weighted = [c for c in cols if isinstance(c, EmbeddingColumn) and c.weighted]
    call = len(g.layers)
    by_name = _slices(g, dense_cols)
    groups = _lookup_groups(g, emb_cols, call_options, call)
    for col in weighted:
        by_name[col.name] = _weighted_input(
            g, col, col.dimension, col.combiner,
            emb_options.resolve(col.name, col.options, call_options), zero_init=False)
    slot_of: dict[str, tuple[SparseGroup, int]] = {}
    for group, slots in groups:
        for slot in slots:
            for col in emb_cols:
                if group.columns[slot] is col.categorical_column and col.name not in slot_of:
                    slot_of[col.name] = (group, slot)
    # TensorFlow's order (by column name); neighbours in one table are read by one reshape
    parts: list[Tensor] = []
    run: list[int] = []
    run_group: SparseGroup | None = None
    for col in cols:
        hit = slot_of.get(col.name)
        if hit is not None and hit[0] is run_group:
            run.append(hit[1])
            continue
        if run_group is not None:
            parts.append(_reshape_slots(g, run_group, run))
            run_group, run = None, []
        if hit is not None:
            run_group, run = hit[0], [hit[1]]
        else:
            parts.append(by_name[col.name])
    if run_group is not None:
        parts.append(_reshape_slots(g, run_group, run))
    return _concat(g, parts, "input_layer/concat")


class DenseFeatures:
    """``tf.keras.layers.DenseFeatures`` (and ``hb.keras.layers.DenseFeatures``, whose
    embedding options it takes): ``DenseFeatures(columns)(features)`` inside a model_fn."""

    def __init__(self, feature_columns: Iterable[FeatureColumn], trainable: bool = True,
                 name: str | None = None, **options: Any) -> None:
        _refuse(trainable, None, "DenseFeatures")
        self.feature_columns = _columns(feature_columns, "DenseFeatures")
        self.name = name
        self.options = emb_options.check_options(options, "DenseFeatures")

    def __call__(self, features: dict, cols_to_output_tensors: Any = None,
                 training: Any = None) -> Tensor:
        _refuse(True, cols_to_output_tensors, "DenseFeatures")
        return build_dense_features(features, self.feature_columns, self.options)


def input_layer(features: dict, feature_columns: Any, weight_collections: Any = None,
                trainable: bool = True, cols_to_vars: Any = None,
                cols_to_output_tensors: Any = None) -> Tensor:
    """``tf.feature_column.input_layer``: the dense tensor of ``feature_columns``."""
    _refuse(trainable, cols_to_vars, cols_to_output_tensors, "input_layer")
    return build_dense_features(features, feature_columns, what="input_layer")


def _refuse(trainable: bool, *dicts: Any, what: str = "") -> None:
    what = what or (dicts[-1] if dicts and isinstance(dicts[-1], str) else "")
    if isinstance(dicts[-1], str):
        dicts = dicts[:-1]
    if not trainable:
        raise ConfigError(f"{what}(trainable=False) is not supported; give the columns "
                          "embedding_column(..., trainable=False) or dense(trainable=False)")
    if any(d is not None for d in dicts):
        raise ConfigError(f"{what}: cols_to_vars / cols_to_output_tensors are not filled "
                          "here; read variables with Estimator.get_variable_value")


def linear_model(features: dict, feature_columns: Any, units: int = 1,
                 sparse_combiner: str = "sum", weight_collections: Any = None,
                 trainable: bool = True, cols_to_vars: Any = None) -> Tensor:
    """``tf.feature_column.linear_model``: ``[batch, units]`` logits, a weight per id of each
    categorical column (one table, zero-initialised) plus a kernel over the dense columns and
    a bias (``linear_model/bias_weights``)."""
    from tierserve.trainer.graph.layers import dense, reduce_sum, reshape

    _refuse(trainable, cols_to_vars, "linear_model")
    g = current_graph("linear_model")
    cols = _columns(feature_columns, "linear_model")
    _check_features(features, cols, "linear_model")
    if sparse_combiner not in ("sum", "mean"):
        raise ConfigError(f"linear_model: sparse_combiner {sparse_combiner!r} is not supported "
                          "(sum or mean)")
    units = int(units)
    cats = [c for c in cols if isinstance(c, CategoricalColumn) and not isinstance(
        c, DenseColumn)]
    dense_like = [c for c in cols if c not in cats]
    plain = [c for c in cats if not isinstance(c, WeightedCategoricalColumn)]
    weighted = [c for c in cats if isinstance(c, WeightedCategoricalColumn)]
    call = len(g.layers)
    sums: list[Tensor] = []
    if plain:
        cols_as_emb = [EmbeddingColumn(c, units, "mean") for c in plain]
        for group, slots in _lookup_groups(g, cols_as_emb, {}, call, linear_units=units,
                                           combiner=sparse_combiner):
            if _whole(group, slots) and len(slots) > 1:  # [slots, units] summed over slots
                sums.append(reduce_sum(Tensor(g, group.table, (len(slots), units)), axis=1))
                continue
            x = _reshape_slots(g, group, slots)
            if len(slots) > 1:
                x = reduce_sum(reshape(x, [len(slots), units]), axis=1)
            sums.append(x)
    for c in weighted:
        col = EmbeddingColumn(c, units, "mean")
        sums.append(_weighted_input(g, col, units, sparse_combiner, {}, zero_init=True))
    total = sums[0] if len(sums) == 1 else None
    if len(sums) > 1:
        from tierserve.trainer.graph.layers import add

        total = add(sums, name="linear_model/weighted_sum")
    if dense_like:
        x = build_dense_features(features, dense_like, what="linear_model")
        out = dense(x, units, name="linear_model/dense", kernel_initializer="zeros",
                    bias_initializer="zeros")
        _rename_bias(g, out)
        if total is not None:
            from tierserve.trainer.graph.layers import add

            out = add([out, total], name="linear_model/logits")
        return out
    # no dense columns: the bias through a fixed identity kernel over the summed weights
    import numpy as np

    out = dense(total, units, name="linear_model/bias", bias_initializer="zeros")
    layer = g.layers[-1]
    kernel = g.param_names[layer["name"]][0]
    g.frozen[kernel] = np.eye(units, dtype=np.float32)
    _rename_bias(g, out)
    return out


def _rename_bias(g: Graph, out: Tensor) -> None:
    layer = g.layers[-1]
    names = g.param_names[layer["name"]]
    bias = g.scoped("linear_model/bias_weights")
    if bias not in [n for ns in g.param_names.values() for n in ns]:
        g.param_names[layer["name"]] = [names[0], bias]


class LinearModel:
    """``tf.keras.experimental.LinearModel``-style callable over feature columns."""

    def __init__(self, feature_columns: Any, units: int = 1, sparse_combiner: str = "sum",
                 **_: Any) -> None:
        self.feature_columns, self.units, self.sparse_combiner = (
            feature_columns, units, sparse_combiner)

    def __call__(self, features: dict) -> Tensor:
        return linear_model(features, self.feature_columns, self.units, self.sparse_combiner)


__all__ = ["DenseFeatures", "FeatureTensor", "LinearModel", "build_dense_features",
           "input_layer", "linear_model"]
