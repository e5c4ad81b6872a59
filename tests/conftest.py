import os
from pathlib import Path

import pytest

# The real data published with the Sailor paper, beside the checkout. Tests
# that need it skip cleanly where it is absent.
SAILOR_DATA = Path(os.environ.get("SAILOR_DATA", Path(__file__).resolve().parents[2] / "shared" / "sailor-data"))


@pytest.fixture(scope="session")
def sailor_data() -> Path:
    if not (SAILOR_DATA / "llm_info.json").exists():
        pytest.skip(f"sailor-data not found at {SAILOR_DATA}")
    return SAILOR_DATA


@pytest.fixture(scope="session")
def sailor_store(sailor_data):
    from planner.profiles.store import load_profiles

    return load_profiles([str(sailor_data)])


# -- the GPU suite (tests/gpu): `pytest -m cuda`, or tools/gpu_check.sh ---------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; runs only when selected with -m cuda "
                                       "(tools/gpu_check.sh), never in CI")


def pytest_collection_modifyitems(config, items):
    selected = "cuda" in (config.getoption("-m") or "")
    for item in items:
        if "cuda" in item.keywords and not selected:
            item.add_marker(pytest.mark.skip(reason="GPU suite: run it with `pytest -m cuda` (tools/gpu_check.sh)"))
