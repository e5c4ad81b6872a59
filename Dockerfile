# sailor for CUDA hosts: the planner, the training runtime (torch + megatron-core) and the CLI.
#   docker build -t sailor .                     (add --build-arg WITH_TE=1 for Transformer Engine)
#   docker run --gpus all sailor plan --model opt-350m
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ARG WITH_TE=0
ENV DEBIAN_FRONTEND=noninteractive PYTHON=python3.11 PIP_NO_CACHE_DIR=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev git build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/sailor
COPY . .
# Exactly the README's set-up: torch==2.13.0 from PyPI is the CUDA build and brings its CUDA
# libraries (a PyTorch base image would ship a second, different torch). Transformer Engine is
# optional: pick the release that matches your CUDA and torch.
# hadolint ignore=DL3013
RUN bash tools/setup.sh \
    && if [ "$WITH_TE" = "1" ]; then .venv/bin/python -m pip install --no-build-isolation "transformer-engine[pytorch]"; fi

ENV PATH=/opt/sailor/.venv/bin:$PATH
ENTRYPOINT ["sailor"]
CMD ["--help"]
