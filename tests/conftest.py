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
