"""Energy per step (perfscope.collect.energy): the meter contract on RAPL in a stand-in powercap
folder and on a stand-in NVML, the recorder putting each traced step's joules in the host record,
and the analysis summing them per GPU or once per machine (docs/metrics.md, Energy)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

import perfscope
from perfscope.analysis.cost import energy_view
from perfscope.record.schema import TraceEntry
from perfscope.collect.energy import EnergyMeter, EnergyProbe, EnergyUnavailable, NvmlMeter, RaplMeter
from perfscope.collect.host import HostStepRecorder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch: a warm-up of 0


def powercap(tmp_path, packages=(1000, 5000), span=2**32):
    """A powercap folder: package zones with counters (µJ), and a subzone that must not count."""
    root = tmp_path / "powercap"
    for i, uj in enumerate(packages):
        zone = root / f"intel-rapl:{i}"
        zone.mkdir(parents=True)
        (zone / "energy_uj").write_text(f"{uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{span}\n")
        sub = root / f"intel-rapl:{i}:0"
        sub.mkdir()
        (sub / "energy_uj").write_text("999999999\n")
    return root


def _set(root, i, uj):
    (root / f"intel-rapl:{i}" / "energy_uj").write_text(f"{uj}\n")


class FakeNvml(types.ModuleType):
    """A stand-in ``pynvml``: one device whose counter (mJ) rises 500 mJ a read, or fails."""

    class NVMLError(Exception):
        pass

    def __init__(self, supported=True):
        super().__init__("pynvml")
        self.supported, self.mj = supported, 10_000

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        if index != 0:
            raise self.NVMLError("Invalid Argument")
        return "h0"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return "h0"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.supported:
            raise self.NVMLError("Not Supported")
        self.mj += 500
        return self.mj


@pytest.fixture
def fake_nvml(monkeypatch):
    module = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def _meters(tmp_path, fake):
    return [RaplMeter(powercap(tmp_path)), NvmlMeter(None, 0)]


def test_every_meter_counts_up_in_joules_and_names_itself(tmp_path, fake_nvml):
    for meter in _meters(tmp_path, fake_nvml):
        assert isinstance(meter, EnergyMeter) and meter.source in ("RAPL", "NVML") and meter.unit in ("machine", "GPU")
        first, second = meter.read(), meter.read()
        assert second >= first


def test_rapl_sums_the_packages_not_their_parts_and_unfolds_a_wrap(tmp_path):
    root = powercap(tmp_path, packages=(1000, 5000), span=10_000)
    meter = RaplMeter(root)
    assert meter.read() == 0.0
    _set(root, 0, 3000)  # +2000 uJ
    _set(root, 1, 1000)  # wrapped: 5000 -> 10000 -> 1000, +6000 uJ
    assert meter.read() == pytest.approx(0.008)


@pytest.mark.parametrize("damage, why", [("absent", "no RAPL package"), ("unreadable", "cannot be read")])
def test_rapl_that_cannot_be_read_says_why(tmp_path, damage, why):
    root = tmp_path / "powercap"
    root.mkdir()
    if damage == "unreadable":
        (root / "intel-rapl:0").mkdir()
        (root / "intel-rapl:0" / "energy_uj").write_text("not a number")
    with pytest.raises(EnergyUnavailable, match=why):
        RaplMeter(root)


def test_nvml_reads_millijoules_and_a_gpu_without_the_counter_says_why(fake_nvml):
    meter = NvmlMeter(None, 0)
    assert meter.read() - meter.read() == pytest.approx(-0.5)  # 500 mJ a read
    fake_nvml.supported = False
    with pytest.raises(EnergyUnavailable, match="Not Supported"):
        NvmlMeter(None, 0)
    with pytest.raises(EnergyUnavailable, match="Invalid Argument"):
        fake_nvml.supported = True
        NvmlMeter(None, 3)


def test_no_pynvml_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(EnergyUnavailable, match="nvidia-ml-py"):
        NvmlMeter(None, 0)


def test_each_traced_step_gets_its_joules_into_the_trace_and_the_summary(tmp_path):
    root = powercap(tmp_path, packages=(0, 0))
    counter = {"uj": 0}
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(skip_first=2, wait=0, warmup=1, active=3, repeat=1),
                                  on_trace_ready=lambda p: p.export_chrome_trace(str(tmp_path / "t.json")))
    rec = HostStepRecorder(prof, energy=EnergyProbe(opener=lambda: RaplMeter(root)))
    with rec:
        for _ in range(8):
            torch.ones(64, 64) @ torch.ones(64, 64)
            counter["uj"] += 2_500_000  # the machine used 2.5 J during this step's work
            _set(root, 0, counter["uj"])
            rec.step()
    assert [r["energy_j"] for r in rec.steps] == [pytest.approx(2.5)] * len(rec.steps)
    header = json.loads((tmp_path / "t.json").read_text())["perfscope_host_steps"]
    assert header["energy"]["source"] == "RAPL" and header["energy"]["unit"] == "machine"
    energy = perfscope.analyze(tmp_path / "t.json").summary()["details"]["energy"]
    assert energy["per_step_j"] == pytest.approx(2.5) and energy["counters"] == 1
    assert energy["why"] == "per 1,000 samples: the batch size is unknown"  # a trace alone holds no batch size


def test_a_probe_without_a_counter_records_why_and_null_joules():
    def none():
        raise EnergyUnavailable("no RAPL package in /x")

    probe = EnergyProbe(opener=none)
    probe.begin()
    assert probe.end() == {"energy_j": None}
    assert probe.record() == {"source": None, "why": "no RAPL package in /x"}


def test_the_job_sums_its_gpus_and_counts_each_machine_once():
    rows = [{"rank": r, "host_energy_j": j} for r, j in ((0, 10.0), (0, 12.0), (1, 20.0), (1, 20.0))]
    gpus = [TraceEntry(rank=r, energy={"source": "NVML", "unit": "GPU", "machine": "a"}) for r in (0, 1)]
    e = energy_view(rows, gpus, world_size=2, batch_size=8)
    assert e.per_step_j == pytest.approx(11.0 + 20.0) and e.counters == 2
    assert e.per_1000_samples_j == pytest.approx(31.0 * 1000 / 16)
    one_machine = [TraceEntry(rank=r, energy={"source": "RAPL", "unit": "machine", "machine": "a"}) for r in (0, 1)]
    assert energy_view(rows, one_machine, world_size=2, batch_size=None).per_step_j == pytest.approx(11.0)
    none = energy_view(rows, [TraceEntry(rank=0, energy={"why": "no RAPL package"})], world_size=1, batch_size=None)
    assert none.per_step_j is None and none.why == "no RAPL package"
    assert energy_view(rows, [TraceEntry(rank=0, energy={})], world_size=1, batch_size=None) is None  # no host record


TRAIN_BUMPING = '''
import os, sys
import torch
path = os.path.join(os.environ["PERFSCOPE_POWERCAP"], "intel-rapl:0", "energy_uj")
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 13):
    loss = model(torch.ones(4, 8)).sum()
    loss.backward()
    with open(path) as f:
        used = int(f.read())
    with open(path, "w") as f:  # the machine used 3 J during this step's work
        f.write(str(used + 3_000_000))
    opt.step()
    opt.zero_grad()
'''


def test_a_measured_trial_reads_each_steps_joules(tmp_path, monkeypatch):
    from perfscope.measure import runner as measure
    from perfscope.measure.protocol import read_step_lines, steps_path

    monkeypatch.setenv("PERFSCOPE_POWERCAP", str(powercap(tmp_path, packages=(0,))))
    script = tmp_path / "train.py"
    script.write_text(TRAIN_BUMPING)
    measure.measure_in_process(script, [], record_dir=tmp_path / "rec", warmup_steps=2, measure_steps=6, energy=True)
    lines = read_step_lines(steps_path(tmp_path / "rec", 0))
    measured = [line for line in lines if line.measured]
    assert len(measured) == 6 and all(line.energy_j == pytest.approx(3.0) for line in measured)
    measure.measure_in_process(script, [], record_dir=tmp_path / "off", warmup_steps=2, measure_steps=6)
    assert all(line.energy_j is None for line in read_step_lines(steps_path(tmp_path / "off", 0)))  # not asked
