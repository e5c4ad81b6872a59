"""The rest of test_hf_families.py's families, in a file of its own: the test runner's workers take whole files
(--dist loadfile), so the two files run side by side."""
from __future__ import annotations

import pytest
from test_hf_families import FAMILIES, FIRST_FILE, check_family

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", FAMILIES[FIRST_FILE:])
def test_family_trains_like_transformers(kind, tmp_path):
    check_family(kind, tmp_path)
