"""Dollars: purchase (amortized), rental and energy cost of a plan. Pure functions.

Definitions (all defaults in ``simulator/data/prices.yaml``, each with its source):

- **Purchase** (``hardware_usd``): GPUs x unit price + one base machine per node. Unit prices
  are the study's for RTX 3090 / A6000 / A100 / H100, else the catalog's ``price_usd``.
- **Purchase units**: GPUs sold only in whole systems (SXM boards on 4- or 8-GPU HGX baseboards,
  ``purchase_units`` in prices.yaml) have no purchase price in other node sizes.
- **Amortized run share** (``amortized_usd``): purchase x days / (lifetime_years x 365), the
  study's convention with a 5-year lifetime, at most the purchase itself (a run longer than the
  lifetime uses the hardware up: ``outlives_hardware``).
- **Rental** (``rent_usd``): GPU-hours x per-GPU-hour cloud price (catalog, with its source).
- **Energy** (``energy_kwh``, ``energy_usd``): board power x GPUs x hours x utilization x PUE,
  priced per kWh. Utilization is the average fraction of board power drawn; by default the
  plan's busy fraction (step time minus exposed communication, offload waits and the GPUs' waits
  for the host's kernel dispatch, over step time), assuming a busy GPU draws its board power. Host CPUs, RAM and fans are not counted.
  Rental prices already include power, so energy is a cost of owning.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ..core.errors import UsageError
from ..core.userfiles import read_text
from ..hardware import catalog as hardware
from ..hardware.catalog import Sourced

DAYS_PER_YEAR = 365.0


class PurchaseUnit(BaseModel):
    """The node sizes a GPU is sold in (whole systems), with the source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus_per_node: list[int]
    source: str

    @field_validator("gpus_per_node")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v):
            raise ValueError(f"gpus_per_node must list positive GPU counts, got {v}")
        return sorted(set(v))


class Prices(BaseModel):
    """Every price and assumption the cost model uses, each a value with its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_purchase_usd: dict[str, Sourced] = {}  # catalog GPU id -> unit price
    base_machine_usd: dict[int, Sourced]  # GPUs per node -> machine price
    purchase_units: dict[str, PurchaseUnit] = {}  # catalog GPU id -> node sizes it is sold in
    lifetime_years: Sourced
    electricity_usd_per_kwh: Sourced
    pue: Sourced
    utilization: Sourced | None = None  # None = from the plan (busy fraction)
    gpu_rent_usd_per_hr: dict[str, Sourced] = {}  # overrides of the catalog's cloud price
    price_per_gpu: Sourced | None = None  # flag override, any GPU
    rent_per_gpu_hour: Sourced | None = None  # flag override, any GPU

    @field_validator("gpu_purchase_usd", "gpu_rent_usd_per_hr")
    @classmethod
    def _positive_map(cls, v: dict[str, Sourced]) -> dict[str, Sourced]:
        for k, s in v.items():
            if s.value <= 0:
                raise ValueError(f"{k}: price must be > 0, got {s.value}")
        return v

    @field_validator("base_machine_usd")
    @classmethod
    def _machines(cls, v: dict[int, Sourced]) -> dict[int, Sourced]:
        if not v:
            raise ValueError("needs at least one base machine price")
        for k, s in v.items():
            if k < 1 or s.value < 0:
                raise ValueError(f"base machine for {k} GPUs: need GPUs >= 1 and price >= 0")
        return v

    @field_validator("lifetime_years", "electricity_usd_per_kwh")
    @classmethod
    def _positive(cls, v: Sourced) -> Sourced:
        if v.value <= 0:
            raise ValueError(f"must be > 0, got {v.value}")
        return v

    @field_validator("pue")
    @classmethod
    def _pue(cls, v: Sourced) -> Sourced:
        if not PUE_RANGE[0] <= v.value <= PUE_RANGE[1]:
            raise ValueError(pue_range_error(v.value))
        return v

    @field_validator("utilization")
    @classmethod
    def _fraction(cls, v: Sourced | None) -> Sourced | None:
        if v is not None and not (0 < v.value <= 1):
            raise ValueError(f"utilization must be in (0, 1], got {v.value}")
        return v


#: Physical range of a facility's power usage effectiveness (facility power over IT power): 1.0
#: is no cooling or conversion overhead at all (the definition's floor); 3.0 is the worst grade of
#: The Green Grid's scale ("very inefficient", EPA Report to Congress on Server and Data Center
#: Energy Efficiency, 2007); surveys report about 1.5-1.6 on average (Uptime Institute 2023).
#: ASSUMPTION: no machine room worth simulating draws more than three times its IT power.
PUE_RANGE = (1.0, 3.0)


def pue_range_error(value: float) -> str:
    """The one-line reason a PUE outside :data:`PUE_RANGE` is refused."""
    return (f"PUE is facility power over IT power: at least {PUE_RANGE[0]:g} (no overhead) and at most "
            f"{PUE_RANGE[1]:g} (a very inefficient room; 1.1-1.6 is typical), got {value!r}")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    return f"field {loc}: {err.get('msg', 'invalid')}"


def _sourced(v, default_source: str):
    """Accept {value, source} or a bare number (sourced as the file it came from)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"value": v, "source": default_source}
    return v


def _normalize(data: dict, origin: str) -> dict:
    out = dict(data)
    for key in ("lifetime_years", "electricity_usd_per_kwh", "pue", "utilization"):
        if key in out and out[key] is not None:
            out[key] = _sourced(out[key], origin)
    for key in ("gpu_purchase_usd", "gpu_rent_usd_per_hr", "base_machine_usd", "purchase_units"):
        if key in out:
            if not isinstance(out[key], dict):
                raise UsageError(f"{origin}: field {key} must be a mapping")
            m = {}
            for k, v in out[key].items():
                if key != "base_machine_usd":
                    k = hardware.get_gpu(str(k)).id  # aliases; unknown -> did-you-mean
                m[k] = v if key == "purchase_units" else _sourced(v, origin)
            out[key] = m
    return out


def _read(text: str, origin: str) -> dict:
    try:
        data = json.loads(text) if origin.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise UsageError(f"{origin}: not valid YAML/JSON ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{origin}: nests its lists or mappings too deeply to be read") from None
    if not isinstance(data, dict):
        raise UsageError(f"{origin}: expected a mapping of price fields")
    return data


@functools.lru_cache(maxsize=1)
def default_prices() -> Prices:
    """The built-in prices (``simulator/data/prices.yaml``), read once per process."""
    text = resources.files("simulator").joinpath("data/prices.yaml").read_text(encoding="utf-8")
    return Prices(**_normalize(_read(text, "prices.yaml"), "simulator/data/prices.yaml"))


def load_prices(path: str | Path | None = None) -> Prices:
    """Built-in prices, with a user file (same layout, any subset of fields) merged over them.

    Maps (GPU prices, base machines) merge key by key; bare numbers are sourced as the file.
    """
    base = default_prices()
    if path is None:
        return base

    p = Path(path)
    user = _normalize(_read(read_text(p, "--prices file"), str(p)), f"prices file {p.name}")
    known = set(Prices.model_fields)
    bad = set(user) - known
    if bad:
        raise UsageError(f"prices file {p.name}: unknown field(s) {', '.join(sorted(bad))}; "
                         f"valid: {', '.join(sorted(known))}")
    merged = base.model_dump()
    for k, v in user.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict) and "value" not in v:
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    try:
        return Prices(**merged)
    except ValidationError as exc:
        raise UsageError(f"prices file {p.name}: {_first_error(exc)}") from None


def with_overrides(prices: Prices, *, price_per_gpu=None, rent_per_gpu_hour=None, kwh_price=None,
                   pue=None, lifetime_years=None, utilization=None) -> Prices:
    """A copy of ``prices`` with the user's own values (sourced "set by you"); a value
    equal to the one in force keeps its source (a form that always passes its fields)."""
    upd = {}
    for key, val, flag in (("price_per_gpu", price_per_gpu, "--price-per-gpu"),
                           ("rent_per_gpu_hour", rent_per_gpu_hour, "--rent-per-gpu-hour"),
                           ("electricity_usd_per_kwh", kwh_price, "--kwh-price"),
                           ("pue", pue, "--pue"), ("lifetime_years", lifetime_years, "--lifetime-years"),
                           ("utilization", utilization, "--gpu-utilization")):
        if val is None:
            continue
        if not (isinstance(val, (int, float)) and math.isfinite(val) and val > 0):
            raise UsageError(f"{flag} must be a positive number, got {val!r}")
        if key == "utilization" and val > 1:
            raise UsageError(f"{flag} is a fraction of board power in (0, 1], got {val!r}")
        if key == "pue" and not PUE_RANGE[0] <= val <= PUE_RANGE[1]:
            raise UsageError(f"{flag}: {pue_range_error(val)}")
        current = getattr(prices, key)
        if current is not None and current.value == float(val):
            continue
        upd[key] = Sourced(value=float(val), source="set by you")
    return prices.model_copy(update=upd) if upd else prices


# --- pure cost functions -------------------------------------------------------------------

def amortized_share(price_usd: float, days: float, lifetime_years: float) -> float:
    """The run's share of a purchase: price x days / (lifetime_years x 365), at most the price (a
    run longer than the lifetime uses the hardware up)."""
    return price_usd * min(1.0, days / (lifetime_years * DAYS_PER_YEAR))


def energy_kwh(board_power_w: float, n_gpus: int, hours: float, utilization: float, pue: float) -> float:
    """Facility energy: board power (kW) x GPUs x hours x utilization x PUE."""
    return board_power_w / 1000.0 * n_gpus * hours * utilization * pue


def plan_utilization(plan) -> float:
    """Busy fraction of a step: (step - exposed communication - offload waits - waits for the host's dispatch) / step, in [0, 1]."""
    step = float(plan.step_time_s)
    if not (step > 0 and math.isfinite(step)):
        return 1.0
    b = plan.breakdown_s
    idle = float(b.get("exposed_comm", 0.0)) + float(b.get("offload", 0.0)) + float(b.get("host_wait", 0.0))
    return min(1.0, max(0.0, (step - idle) / step))


def _price(flag: Sourced | None, table: dict[str, Sourced], gpu_id: str, catalog_field: str) -> Sourced | None:
    """A price in order of precedence: the flag, the prices file's table, the catalog GPU's field;
    None for the local device (no catalog entry)."""
    if flag is not None:
        return flag
    if gpu_id in table:
        return table[gpu_id]
    return None if gpu_id == "local" else getattr(hardware.get_gpu(gpu_id), catalog_field)


def gpu_unit_price(prices: Prices, gpu_id: str) -> Sourced | None:
    """Purchase price of one GPU: flag, prices file/study, catalog, else None (unknown)."""
    return _price(prices.price_per_gpu, prices.gpu_purchase_usd, gpu_id, "price_usd")


def rent_price(prices: Prices, gpu_id: str) -> Sourced | None:
    """Cloud price per GPU-hour: flag, prices file, catalog, else None (unknown)."""
    return _price(prices.rent_per_gpu_hour, prices.gpu_rent_usd_per_hr, gpu_id, "cloud_usd_per_gpu_hr")


def base_machine_price(prices: Prices, gpus_per_node: int) -> Sourced:
    """Base machine for a node of ``gpus_per_node`` GPUs: that size, else the next larger one
    (beyond the largest listed: enough of the largest machines)."""
    sizes = sorted(prices.base_machine_usd)
    for s in sizes:
        if s >= gpus_per_node:
            m = prices.base_machine_usd[s]
            if s == gpus_per_node:
                return m
            return Sourced(value=m.value, source=f"{m.source} (the {s}-GPU machine for {gpus_per_node} GPUs)")
    big = sizes[-1]
    k = math.ceil(gpus_per_node / big)
    m = prices.base_machine_usd[big]
    return Sourced(value=k * m.value, source=f"{k} x {m.source}")


def purchase_note(prices: Prices, gpu_id: str, gpus_per_node: int) -> str | None:
    """Why a node of ``gpus_per_node`` of this GPU cannot be bought (sold only in whole systems
    of other sizes), or None."""
    unit = prices.purchase_units.get(gpu_id)
    if unit is None or gpus_per_node in unit.gpus_per_node:
        return None
    sizes = " or ".join(str(n) for n in unit.gpus_per_node)
    return f"sold only in systems of {sizes} GPUs ({unit.source})"


def hardware_price(prices: Prices, gpu_id: str, nodes: int, gpus_per_node: int) -> dict:
    """Purchase price of a cluster: GPUs x unit + nodes x base machine (None when unknown, or
    when the GPU is not sold in nodes of this size: ``purchase_note``).

    A calibrated local device (``gpu_id == 'local'``) has no base machine price: only GPUs
    priced by --price-per-gpu are counted.
    """
    unit = gpu_unit_price(prices, gpu_id)
    base = None if gpu_id == "local" else base_machine_price(prices, gpus_per_node)
    note = None if gpu_id == "local" else purchase_note(prices, gpu_id, gpus_per_node)
    n = nodes * gpus_per_node
    total = None
    if unit is not None and note is None:
        total = n * unit.value + (nodes * base.value if base is not None else 0.0)
    return {"hardware_usd": total, "purchase_note": note, "gpu_unit_usd": unit.value if unit else None,
            "gpu_unit_source": unit.source if unit else None,
            "base_machine_usd": (nodes * base.value) if base is not None else None,
            "base_machine_source": base.source if base is not None else None}


def cost(prices: Prices, *, gpu_id: str, nodes: int, gpus_per_node: int, days: float,
         board_power_w: float | None, utilization: float) -> dict:
    """The ``cost`` object of a plan (dollars; None where a price is unknown)."""
    n = nodes * gpus_per_node
    hours = days * 24.0
    gpu_hours = n * hours
    out = {"gpu_hours": gpu_hours}
    out.update(hardware_price(prices, gpu_id, nodes, gpus_per_node))
    life = prices.lifetime_years.value
    out["lifetime_years"] = life
    out["amortized_usd"] = (amortized_share(out["hardware_usd"], days, life)
                            if out["hardware_usd"] is not None else None)
    out["outlives_hardware"] = days > life * DAYS_PER_YEAR
    r = rent_price(prices, gpu_id)
    out["rent_usd_per_gpu_hr"] = r.value if r else None
    out["rent_source"] = r.source if r else None
    out["rent_usd"] = gpu_hours * r.value if r else None
    util = prices.utilization.value if prices.utilization is not None else utilization
    out["utilization"] = util
    out["utilization_source"] = (prices.utilization.source if prices.utilization is not None else
                                 "plan busy fraction (step minus exposed communication, offload and waits for the host's dispatch, over step)")
    out["board_power_w"] = board_power_w
    out["pue"] = prices.pue.value
    out["electricity_usd_per_kwh"] = prices.electricity_usd_per_kwh.value
    if board_power_w:
        kwh = energy_kwh(board_power_w, n, hours, util, prices.pue.value)
        out["energy_kwh"] = kwh
        out["energy_usd"] = kwh * prices.electricity_usd_per_kwh.value
    else:
        out["energy_kwh"] = out["energy_usd"] = None
    bad = [k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise UsageError(f"cost figure {bad[0]} is not a finite number: a price, lifetime or PUE is beyond "
                         "what the cost model can represent; check the prices")
    return out


def plan_cost(plan, prices: Prices | None = None) -> dict:
    """The ``cost`` object for a Plan (see :func:`cost`)."""
    prices = prices or default_prices()
    hw = plan.hardware
    return cost(prices, gpu_id=hw["gpu_id"], nodes=int(hw["nodes"]), gpus_per_node=int(hw["gpus_per_node"]),
                days=float(plan.days), board_power_w=hw.get("board_power_w"),
                utilization=plan_utilization(plan))


def assumptions(prices: Prices) -> list[str]:
    """Human-readable list of the cost assumptions with their sources."""
    util = (f"{prices.utilization.value:.0%} of board power ({prices.utilization.source})"
            if prices.utilization is not None else
            "GPUs draw their board power while busy (busy fraction of the step from the plan); "
            "host CPUs, RAM and fans not counted")
    return [
        f"amortization: hardware price x days / ({prices.lifetime_years.value:g} x 365) "
        f"({prices.lifetime_years.source})",
        f"electricity ${prices.electricity_usd_per_kwh.value:.3g}/kWh ({prices.electricity_usd_per_kwh.source})",
        f"PUE {prices.pue.value:g} ({prices.pue.source})",
        f"power: {util}",
        "base machine: one per node (network switches and cables not included)",
        "rental prices are on-demand per GPU-hour and include power; storage and egress not included",
    ]


# --- formatting and command-line plumbing ------------------------------------------------

def usd(x: float | None) -> str:
    """'$12,345' or '—' when unknown."""
    return "—" if x is None else f"${x:,.0f}"


def format_line(c: dict) -> str:
    """`buy $NN,NNN (run share $N,NNN over 5 years) · rent $NN,NNN · power N,NNN kWh ($NNN)`."""
    if c.get("hardware_usd") is not None:
        buy = (f"buy {usd(c['hardware_usd'])} (run share {usd(c['amortized_usd'])} over "
               f"{c['lifetime_years']:g} years)" if not c.get("outlives_hardware") else
               f"buy {usd(c['hardware_usd'])} (run share: all of it; the run outlasts the hardware's "
               f"{c['lifetime_years']:g}-year lifetime)")
    elif c.get("purchase_note"):
        buy = f"buy: {c['purchase_note'].split(' (')[0]}"
    else:
        buy = "buy: no price (pass --price-per-gpu)"
    rent = f"rent {usd(c['rent_usd'])}" if c.get("rent_usd") is not None else "rent: no price (pass --rent-per-gpu-hour)"
    if c.get("energy_kwh") is not None:
        power = f"power {c['energy_kwh']:,.0f} kWh ({usd(c['energy_usd'])})"
    else:
        power = "power: unknown board power"
    return f"{buy} · {rent} · {power}"


def _nonneg_float(flag):
    def conv(text):
        try:
            v = float(str(text).replace(",", "").lstrip("$"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}") from None
        if not (v > 0 and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}")
        return v
    return conv


def add_cost_args(p: argparse.ArgumentParser) -> None:
    """The cost flags shared by `simulate`, `compare`, `budget` and `study-grid`."""
    g = p.add_argument_group("cost (defaults: simulator/data/prices.yaml, with sources)")
    g.add_argument("--prices", metavar="FILE", help="YAML/JSON prices file merged over the defaults")
    g.add_argument("--price-per-gpu", type=_nonneg_float("--price-per-gpu"), metavar="USD",
                   help="purchase price per GPU (any GPU)")
    g.add_argument("--rent-per-gpu-hour", type=_nonneg_float("--rent-per-gpu-hour"), metavar="USD",
                   help="cloud price per GPU-hour (any GPU)")
    g.add_argument("--kwh-price", type=_nonneg_float("--kwh-price"), metavar="USD", help="electricity $/kWh")
    g.add_argument("--pue", type=_nonneg_float("--pue"),
                   help=f"facility power usage effectiveness, {PUE_RANGE[0]:g} to {PUE_RANGE[1]:g} (default 1.5)")
    g.add_argument("--lifetime-years", type=_nonneg_float("--lifetime-years"), metavar="Y",
                   help="amortization lifetime (default 5, as the study)")
    g.add_argument("--gpu-utilization", type=_nonneg_float("--gpu-utilization"), metavar="F",
                   help="average fraction of board power drawn (default: the plan's busy fraction)")


def prices_from_args(a: argparse.Namespace) -> Prices:
    """Prices from --prices plus the flag overrides."""
    return with_overrides(load_prices(a.prices), price_per_gpu=a.price_per_gpu,
                          rent_per_gpu_hour=a.rent_per_gpu_hour, kwh_price=a.kwh_price, pue=a.pue,
                          lifetime_years=a.lifetime_years, utilization=a.gpu_utilization)
