"""The set-associative table's slot conventions, shared by the table
(:mod:`.set_associative`) and its numba kernels (:mod:`.cpu_kernels`)."""

#: an empty slot's key (never a cached key)
EMPTY = -(2**63)
#: batches of more keys than this stamp only every ``STAMP_STRIDE``-th hit
STAMP_ALL = 4096
STAMP_STRIDE = 4
