"""The categorical codes: each IntEnum member is the index of its name in the tuple."""

from __future__ import annotations

import pytest

from perfmodel.core.codes import (
    COMPRESSION,
    RECOMPUTE,
    SCHEDULE,
    Compression,
    Recompute,
    Schedule,
)


@pytest.mark.parametrize(("enum", "names"), [(Recompute, RECOMPUTE), (Schedule, SCHEDULE),
                                             (Compression, COMPRESSION)])
def test_enum_members_are_the_indices_of_the_names(enum, names):
    assert [m.value for m in enum] == list(range(len(names)))
    spelled = {"ONE_F_ONE_B": "1f1b", "ONE_BIT": "1bit"}
    assert [spelled.get(m.name, m.name.lower()) for m in enum] == list(names)
