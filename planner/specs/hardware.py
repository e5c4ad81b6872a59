"""GPUs, zones and clusters: what the hardware is, where it is, what it costs.

The built-in catalog holds public spec-sheet numbers (dense tensor-core peaks,
no sparsity) and public cloud list prices (GCP, USD per GPU-hour, late 2025;
consumer cards get a typical community-cloud price). A cluster file (YAML or
JSON) overrides or extends any of it, and lists the GPUs actually available:

    gpus:                     # optional: new types or overrides of catalog fields
      A100-40: {price_per_hour: 3.2}
    zones:                    # optional: new zones
      my-dc-1: {region: my-dc}
    available:                # what the planner may use
      - {gpu: A100-40, zone: us-central1-a, count: 64}
      - {gpu: V100-16, zone: us-central1-b, count: 32, spot: true}
    quotas: {us-central1-a: 48}      # optional: max GPUs per zone
    prices:                   # optional: price of one GPU type in one zone
      - {gpu: A100-40, zone: us-west1-b, price_per_hour: 3.9}
    egress_usd_per_gb: {us-central1-a: {us-west1-b: 0.02}}   # optional
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from planner.errors import SailorError
from planner.inputs import MAX_COUNT, Doc, read_document, short, suggest

GIB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    """One GPU type. Bandwidths in GB/s (1e9 bytes/s), one direction."""

    name: str
    memory_bytes: int
    fp32_tflops: float  # fp32 matmul peak: TF32 tensor cores where the GPU has them, else FP32 units
    bf16_tflops: float  # dense 16-bit tensor-core peak (fp16 where bf16 is missing)
    hbm_gbps: float
    intra_node_gbps: float  # GPU-to-GPU inside a node (NVLink or PCIe), per GPU
    gpus_per_node: int
    node_nic_gbps: float  # a node's network bandwidth to other nodes, all GPUs together
    price_per_hour: float  # on-demand, USD per GPU-hour
    spot_price_per_hour: float
    # Memory a training process holds outside tensors: CUDA context, cuBLAS and
    # communication buffers. 1.5 GiB is typical for PCIe/SXM cards; GH200's
    # value is measured (see docs/simulator.md).
    runtime_overhead_bytes: int = int(1.5 * GIB)
    # fp32 peak of the FP32 units (no tensor cores): what fp32 matmuls get with TF32 off.
    # 0: fp32_tflops (GPUs without TF32).
    fp32_units_tflops: float = 0.0
    bf16: bool = True  # runs bf16 (V100, T4 and Turing cards have fp16 tensor cores only)

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for `precision` (fp32 or bf16/fp16)."""
        return 1e12 * (self.fp32_tflops if precision == "fp32" else self.bf16_tflops)


def _gpu(name, mem_gib, fp32, bf16, hbm, intra, per_node, nic, price, spot, overhead_gib=1.5, fp32_units=0.0,
         has_bf16=True):
    return GPUSpec(name, int(mem_gib * GIB), fp32, bf16, hbm, intra, per_node, nic, price, spot,
                   int(overhead_gib * GIB), fp32_units, has_bf16)


# name, memory GiB, fp32 matmul TFLOP/s (TF32 on Ampere and later), bf16 TFLOP/s, HBM GB/s, intra-node GB/s per GPU,
# GPUs per node, node NIC GB/s, on-demand $/h, spot $/h [, runtime overhead GiB] [, FP32-unit TFLOP/s]
CATALOG: dict[str, GPUSpec] = {g.name: g for g in (
    _gpu("V100-16", 16, 15.7, 125, 900, 150, 4, 4.0, 2.48, 0.74, has_bf16=False),  # fp16 tensor cores, no bf16
    _gpu("A100-40", 40, 156, 312, 1555, 300, 4, 6.25, 3.67, 1.10, fp32_units=19.5),
    _gpu("A100-80", 80, 156, 312, 2039, 300, 4, 12.5, 5.07, 1.57, fp32_units=19.5),
    _gpu("H100-80", 80, 494, 989, 3350, 450, 8, 25.0, 11.06, 2.25, fp32_units=67),
    _gpu("H200", 141, 494, 989, 4800, 450, 8, 50.0, 10.60, 3.72, fp32_units=67),
    _gpu("GH200-96", 95.58, 494, 989, 4000, 450, 4, 100.0, 11.06, 3.50, overhead_gib=3.5, fp32_units=67),
    _gpu("L4", 24, 60, 121, 300, 16, 8, 12.5, 0.71, 0.22, fp32_units=30.3),
    _gpu("T4", 16, 8.1, 65, 320, 8, 4, 4.0, 0.35, 0.11, has_bf16=False),
    _gpu("RTX-3090", 24, 35.6, 71, 936, 16, 8, 0.125, 0.40, 0.20),
    _gpu("RTX-2080", 11, 13.4, 54, 616, 8, 8, 0.125, 0.20, 0.10, has_bf16=False),  # RTX 2080 Ti, 11 GB
    _gpu("Titan-RTX", 24, 16.3, 130, 672, 8, 8, 0.125, 0.30, 0.15, has_bf16=False),
    # The "GPU" of CPU-only runs (tests, the local example). Numbers are a
    # 2-core VM's; profile it with `sailor profile model --device cpu`.
    _gpu("CPU", 8, 0.05, 0.05, 20, 5, 8, 1.0, 0.0, 0.0, overhead_gib=0.5),
)}
GPU_ALIASES = {
    "GH-96": "GH200-96", "GH200": "GH200-96", "H100": "H100-80", "A100": "A100-40", "V100": "V100-16",
    "RTX-2080-TI": "RTX-2080", "TITAN-RTX": "Titan-RTX",
}
# Sailor's names for GPU types in its data files.
SAILOR_GPU_NAMES = {"GH200-96": "GH-96"}


@dataclass(frozen=True)
class Zone:
    """A cloud zone (or an on-premise site); zones of one region are close."""

    name: str
    region: str


def _zones(*names: str) -> dict[str, Zone]:
    return {n: Zone(n, n.rsplit("-", 1)[0]) for n in names}


ZONES: dict[str, Zone] = {**_zones(
    "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-a", "us-west1-b",
    "us-east1-b", "us-east1-c", "us-east4-a", "europe-west4-a", "europe-west4-b", "asia-east1-a",
), "local": Zone("local", "local")}  # this machine: CPU runs and tests
# Egress USD per GB (GCP list prices): same zone free, same region 0.01,
# same continent 0.02, between continents 0.08.
EGRESS_SAME_REGION, EGRESS_SAME_CONTINENT, EGRESS_INTERCONTINENTAL = 0.01, 0.02, 0.08


@dataclass(frozen=True)
class Pool:
    """GPUs of one type available in one zone."""

    gpu: str
    zone: str
    count: int
    spot: bool = False

    @property
    def key(self) -> str:
        return f"{self.gpu}@{self.zone}"


@dataclass(frozen=True)
class Cluster:
    """The hardware world: GPU types, zones, prices, and what is available."""

    gpus: Mapping[str, GPUSpec] = field(default_factory=lambda: dict(CATALOG))
    zones: Mapping[str, Zone] = field(default_factory=lambda: dict(ZONES))
    available: tuple[Pool, ...] = ()
    quotas: Mapping[str, int] = field(default_factory=dict)  # zone -> max GPUs
    prices: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (gpu, zone) -> $/h
    egress: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (zone, zone) -> $/GB

    def gpu(self, name: str) -> GPUSpec:
        key = canonical_gpu(name, self.gpus)
        if key is None:
            raise SailorError(
                f"unknown GPU type {short(name)}{suggest(name, self.gpus)}: known types are {', '.join(sorted(self.gpus))} "
                "(`sailor list gpus`); add others under 'gpus:' in a cluster file"
            )
        return self.gpus[key]

    def check_zone(self, name: str, where: str) -> str:
        """`name` if it is a known zone; else one line naming `where` it came from (the edges call this)."""
        if name not in self.zones:
            raise SailorError(f"{where}: unknown zone {short(name)}{suggest(name, self.zones)}; known zones are "
                              f"{', '.join(self.zones)} (`sailor list zones`); declare other sites under 'zones:' "
                              "in a cluster file")
        return name

    def zone(self, name: str) -> Zone:
        if name not in self.zones:
            # The edges refuse undeclared zones (check_zone); code that builds a cluster by hand may
            # still use one: its region is its name.
            return Zone(name, name.rsplit("-", 1)[0] if name.count("-") >= 2 else name)
        return self.zones[name]

    def price_per_hour(self, gpu: str, zone: str, spot: bool = False) -> float:
        """USD per GPU-hour of `gpu` in `zone`."""
        spec = self.gpu(gpu)
        if (spec.name, zone) in self.prices:
            return self.prices[(spec.name, zone)]
        return spec.spot_price_per_hour if spot else spec.price_per_hour

    def egress_per_gb(self, src: str, dst: str) -> float:
        """USD per GB sent from zone `src` to zone `dst`."""
        if src == dst:
            return 0.0
        if (src, dst) in self.egress:
            return self.egress[(src, dst)]
        a, b = self.zone(src), self.zone(dst)
        if a.region == b.region:
            return EGRESS_SAME_REGION
        if a.region.split("-")[0] == b.region.split("-")[0]:
            return EGRESS_SAME_CONTINENT
        return EGRESS_INTERCONTINENTAL

    def is_spot(self, gpu: str, zone: str) -> bool:
        return any(p.spot for p in self.available if p.gpu == gpu and p.zone == zone)

    def with_available(self, pools: tuple[Pool, ...]) -> "Cluster":
        return replace(self, available=pools)


def canonical_gpu(name: str, gpus: Mapping[str, GPUSpec] = CATALOG) -> str | None:
    if name in gpus:
        return name
    alias = GPU_ALIASES.get(name) or GPU_ALIASES.get(name.upper())
    if alias in gpus:
        return alias
    lowered = {k.lower(): k for k in gpus}
    return lowered.get(name.lower())


def parse_gpus(spec: str, cluster: Cluster, flag: str = "--gpus") -> tuple[Pool, ...]:
    """Parse the quick form `TYPE@ZONE=COUNT,...` (zone optional: us-central1-a)."""
    form = "write TYPE@ZONE=COUNT,..., e.g. A100-40@us-central1-a=64 (`sailor list gpus`, `sailor list zones`)"
    if not spec.strip():
        raise SailorError(f"{flag} is empty; {form}")
    pools = []
    for item in (s.strip() for s in spec.split(",")):
        what, eq, count = item.rpartition("=")
        gpu, at, zone = what.partition("@")
        if not item or not eq or not gpu or (at and not zone):
            raise SailorError(f"bad {flag} item {item!r}: {form}")
        if not (count.strip().isascii() and count.strip().isdigit()) or int(count) > MAX_COUNT:
            raise SailorError(f"bad {flag} item {item!r}: the count must be an integer from 0 to {MAX_COUNT}")
        zone = cluster.check_zone(zone.strip(), f"{flag} item {item!r}") if at else "us-central1-a"
        pools.append(Pool(cluster.gpu(gpu.strip()).name, zone, int(count)))
    return tuple(_merge(pools))


def _merge(pools: list[Pool]) -> list[Pool]:
    merged: dict[tuple[str, str, bool], int] = {}
    for p in pools:
        merged[(p.gpu, p.zone, p.spot)] = merged.get((p.gpu, p.zone, p.spot), 0) + p.count
    return [Pool(g, z, n, s) for (g, z, s), n in merged.items() if n > 0]


GPU_NUMBERS = {  # cluster-file field -> (lowest value, highest value, "int" or "number")
    "memory_bytes": (1, 1 << 50, "int"), "fp32_tflops": (0, 1e7, "positive"), "bf16_tflops": (0, 1e7, "positive"),
    "hbm_gbps": (0, 1e7, "positive"), "intra_node_gbps": (0, 1e7, "positive"), "gpus_per_node": (1, 1024, "int"),
    "node_nic_gbps": (0, 1e7, "positive"), "price_per_hour": (0, 1e6, "number"),
    "spot_price_per_hour": (0, 1e6, "number"), "runtime_overhead_bytes": (0, 1 << 50, "int"),
    "fp32_units_tflops": (0, 1e7, "number"),  # 0: as fp32_tflops (no TF32)
}
OPTIONAL_GPU_FIELDS = ("runtime_overhead_bytes", "fp32_units_tflops", "bf16")  # a new GPU type may leave these out
CLUSTER_HINT = "see the cluster file format in docs/formats.md"
RESERVED = "@=,"  # a name with these could not be written in --gpus


def _gpu_fields(name: str, doc: Doc, base: GPUSpec | None) -> GPUSpec:
    """A catalog GPU with some fields overridden, or a new GPU with every field given."""
    over = {}
    for key, field_doc in doc.fields(optional=(*GPU_NUMBERS, "memory_gb", "bf16"), hint=CLUSTER_HINT).items():
        if key == "bf16":  # optional: whether it runs bf16 (default true)
            over["bf16"] = field_doc.bool()
            continue
        if key == "memory_gb":
            over["memory_bytes"] = int(field_doc.number(above=0.0, hi=1e6) * GIB)
            continue
        lo, hi, kind = GPU_NUMBERS[key]
        over[key] = field_doc.int(lo, int(hi)) if kind == "int" else \
            field_doc.number(above=0.0, hi=hi) if kind == "positive" else field_doc.number(lo, hi)
    if base is not None:
        return replace(base, **over)
    missing = [k for k in GPU_NUMBERS if k not in over and k not in OPTIONAL_GPU_FIELDS]
    if missing:
        raise SailorError(f"{doc.source}: new GPU type {name!r} needs {', '.join(missing)} (memory_gb may replace "
                          f"memory_bytes); or did you mean one of {', '.join(CATALOG)}?")
    return GPUSpec(name=name, **over)


def _name(doc: Doc, key: str, what: str) -> str:
    if not key.strip() or any(c in key for c in RESERVED) or len(key) > 100 or not key.isprintable():
        raise SailorError(f"{doc.source}: {what} name {key!r} must be non-empty, printable (no line breaks or "
                          f"tabs), without {RESERVED!r}, at most 100 characters")
    return key


def load_cluster(path: str | None = None, base: Cluster | None = None) -> Cluster:
    """The built-in catalog, extended by a YAML/JSON cluster file if given (every field checked)."""
    cluster = base or Cluster()
    if not path:
        return cluster
    top = read_document(path, "cluster file").fields(
        optional=("gpus", "zones", "available", "quotas", "prices", "egress_usd_per_gb"), hint=CLUSTER_HINT)
    top = {k: v for k, v in top.items() if v.value is not None}  # an empty YAML section is null: nothing in it
    gpus = dict(cluster.gpus)
    for name, over in top["gpus"].entries(CLUSTER_HINT) if "gpus" in top else ():
        key = canonical_gpu(_name(over, name, "GPU type"), gpus)
        gpus[key or name] = _gpu_fields(name, over, gpus[key] if key else None)
    zones = dict(cluster.zones)
    for name, z in top["zones"].entries(CLUSTER_HINT) if "zones" in top else ():
        region = z.fields(optional=("region",), hint=CLUSTER_HINT).get("region") if z.value is not None else None
        zones[_name(z, name, "zone")] = Zone(name, region.str() if region is not None else name)
    cluster = replace(cluster, gpus=gpus, zones=zones)

    def gpu(doc: Doc) -> str:
        return cluster.gpu(doc.str()).name if canonical_gpu(doc.str(), gpus) else \
            doc.fail(f"a GPU type{suggest(doc.value, gpus)}: one of {', '.join(gpus)}", "add others under 'gpus:'")

    def zone(doc: Doc) -> str:
        return cluster.check_zone(doc.str(), f"{doc.source}: {doc.path}")

    pools = []
    for item in top["available"].items(hint=CLUSTER_HINT) if "available" in top else ():
        f = item.fields(("gpu", "zone", "count"), ("spot",), CLUSTER_HINT)
        pools.append(Pool(gpu(f["gpu"]), zone(f["zone"]), f["count"].int(0, MAX_COUNT),
                          f["spot"].bool() if "spot" in f else False))
    prices = {}
    for item in top["prices"].items(hint=CLUSTER_HINT) if "prices" in top else ():
        f = item.fields(("gpu", "zone", "price_per_hour"), hint=CLUSTER_HINT)
        prices[(gpu(f["gpu"]), zone(f["zone"]))] = f["price_per_hour"].number(0, 1e6)
    egress = {}
    for a, row in top["egress_usd_per_gb"].entries(CLUSTER_HINT) if "egress_usd_per_gb" in top else ():
        cluster.check_zone(a, f"{row.source}: egress_usd_per_gb")
        for b, v in row.entries(CLUSTER_HINT):
            egress[(a, zone(Doc(b, v.source, v.path)))] = v.number(0, 1e3)
    quotas = {}
    for z, n in top["quotas"].entries(CLUSTER_HINT) if "quotas" in top else ():
        quotas[zone(Doc(z, n.source, n.path))] = n.int(0, MAX_COUNT)
    return replace(cluster, available=tuple(_merge(pools)), prices=prices, egress=egress, quotas=quotas)
