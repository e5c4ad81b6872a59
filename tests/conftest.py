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


# Test files that start several processes (training ranks, agents, controllers) and watch them with
# heartbeats and deadlines. Under the README's `-n auto --dist loadfile` they run one after another on one
# worker, beside the single-process files on the others: two of them at once on a 2-core machine starved
# an agent's heartbeat and a job's shutdown past their limits. (xdist's own --dist loadgroup does not
# group tests under pytest 9.) The deploy files that only run `sailor launch` and a client's parser, one
# process at a time, are not among them: beside the others they even out the two workers' loads.
PROCESS_DIRS = ("elastic", "runtime", "deploy", "profiler")
PARSE_ONLY = ("test_megatron_lm.py", "test_targets.py")


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from xdist.scheduler import LoadFileScheduling

    class ProcessFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = Path(path).parts
            many = (len(parts) > 2 and parts[1] in PROCESS_DIRS and parts[-1] not in PARSE_ONLY) \
                or parts[-1] == "test_readme.py"
            return "processes" if many else path

    return ProcessFilesTogether(config, log)


def pytest_collection_modifyitems(config, items):
    selected = "cuda" in (config.getoption("-m") or "")
    for item in items:
        if "cuda" in item.keywords and not selected:
            item.add_marker(pytest.mark.skip(reason="GPU suite: run it with `pytest -m cuda` (tools/gpu_check.sh)"))


@pytest.fixture(scope="session")
def s3_root():
    """An S3 bucket on a local S3-compatible server (moto's server mode, a free port), reached through
    s3fs as any s3:// URL is; the environment points every process the test starts at it."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec

    fsspec.filesystem("s3").mkdir("sailor-test")
    try:
        yield "s3://sailor-test"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
