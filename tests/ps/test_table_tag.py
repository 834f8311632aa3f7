import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.ps.table_tag import parse_table_tag, table_tag


def test_round_trip():
    assert table_tag("dlrm", "sparse_embedding1") == "hps_et.dlrm.sparse_embedding1"
    assert parse_table_tag("hps_et.dlrm.sparse_embedding1") == ("dlrm", "sparse_embedding1")


@pytest.mark.parametrize("model, table", [("a.b", "t"), ("m", ""), ("m", "x" * 121), ("../x", "t")])
def test_bad_names(model, table):
    with pytest.raises(InvalidInputError, match="must match"):
        table_tag(model, table)


@pytest.mark.parametrize("tag", ["hps_et.m", "hps.m.t", "hps_et.m.t.u", "hps_et..t"])
def test_bad_tags(tag):
    with pytest.raises(InvalidInputError, match="is not a table tag"):
        parse_table_tag(tag)
