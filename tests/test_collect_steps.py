"""Collection: where step boundaries go (optimizer hook, markers, accumulation,
several optimizers, skipped AMP steps, closure optimizers). Each test profiles a tiny script in
this process; traces are read with gzip + json directly.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from perfscope.collect import (  # noqa: E402
    ProfileSchedule,
    collect,
)
from perfscope.control import step  # noqa: E402
from collectkit import (  # noqa: E402
    SMALL,
    assert_no_straddling,
    count_in,
    loop_script,
    profiler_steps,
    trace_events,
    write_script,
)


# --------------------------------------------------------------------------- steps


def test_steps_from_optimizer_hook(tmp_path):
    result = collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.exit_code == 0 and result.error is None
    assert result.stopped_early and result.steps_seen == SMALL.window_steps
    assert result.trace_files == [tmp_path / "out" / "traces" / "rank0.pt.trace.json.gz"]
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    # Profiler step N is training step N: skip 1, warm up 1, record 3..5.
    assert [s["name"] for s in steps] == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    for s in steps:
        assert count_in(events, s, "Optimizer.step#") == 1
        assert count_in(events, s, "enumerate(DataLoader)#") == 1


def test_steps_without_dataloader_use_forward_boundary(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(4, 8)
        while True:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        """,
    )
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    assert len(steps) == SMALL.active
    for s in steps:
        assert count_in(events, s, "Optimizer.step#") == 1
        assert count_in(events, s, "aten::linear") == 1


def test_explicit_step_marker_without_optimizer(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        from perfscope.control import step
        w = torch.randn(8, 1, requires_grad=True)
        x = torch.randn(4, 8)
        for _ in range(10**6):
            loss = (x @ w).square().sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad = None
            with torch.profiler.record_function("my_update_done"):
                pass
            step()
        """,
    )
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.exit_code == 0 and result.stopped_early
    assert result.steps_seen == SMALL.window_steps
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    assert len(steps) == SMALL.active
    for s in steps:
        assert count_in(events, s, "my_update_done") == 1


def test_explicit_marker_with_optimizer_is_not_double_counted(tmp_path):
    script = loop_script(tmp_path, iterations=8, extra="perfscope_step()")
    script.write_text("from perfscope.control import step as perfscope_step\n" + script.read_text())
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=0)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.exit_code == 0 and not result.stopped_early
    assert result.steps_seen == 8
    steps = assert_no_straddling(trace_events(result.trace_files[0]))
    assert len(steps) == 2


def test_step_is_a_noop_when_not_profiling():
    step()  # must not raise


def test_gradient_accumulation_step_spans_micro_batches(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        loader = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=2)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x,) in enumerate(loader):
            model(x).sum().backward()   # one micro-batch
            if i % 2 == 1:              # update every 2 micro-batches
                opt.step()
                opt.zero_grad()
        """,
    )
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.steps_seen == SMALL.window_steps
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    assert len(steps) == SMALL.active
    for s in steps:
        assert count_in(events, s, "aten::linear") == 2  # two forwards
        assert count_in(events, s, "enumerate(DataLoader)#") == 2
        assert count_in(events, s, "Optimizer.step#") == 1


def test_several_optimizers_count_one_step_per_iteration(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        body, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        opt_body = torch.optim.SGD(body.parameters(), lr=0.01)
        opt_head = torch.optim.Adam(head.parameters())
        x = torch.randn(4, 8)
        for _ in range(9):
            head(body(x)).sum().backward()
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad(); opt_head.zero_grad()
        """,
    )
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=0)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.steps_seen == 9
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    for s in steps:
        assert count_in(events, s, "Optimizer.step#SGD") == 1
        assert count_in(events, s, "Optimizer.step#Adam") == 1


def test_amp_skipped_steps_still_count(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        stepped = 0
        def count(*_):
            global stepped
            stepped += 1
        opt.register_step_post_hook(count)
        for i in range(10):
            loss = model(torch.randn(2, 4)).sum()
            if i in (2, 5):
                loss = loss * float("inf")  # GradScaler skips optimizer.step()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert stepped == 8, stepped
        """,
    )
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=0)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.error is None
    assert result.steps_seen == 10  # the 2 skipped updates count as steps
    assert len(profiler_steps(trace_events(result.trace_files[0]))) == 2


def test_warm_up_optimizer_still_alive_hands_over_the_lead(tmp_path):
    # A warm-up optimizer kept in a module global steps first; the training
    # optimizer must take over once it steps twice with no warm-up step between.
    script = write_script(
        tmp_path,
        """
        import torch
        model = torch.nn.Linear(8, 8)
        warm = torch.optim.SGD(model.parameters(), lr=1e-4)
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward(); warm.step(); warm.zero_grad()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(12):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        """,
    )
    schedule = ProfileSchedule(skip_first=3, warmup=1, active=3, max_steps=0)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    # 2 warm-up steps, then Adam's from its 2nd step (the one that took over;
    # step 3 holds Adam's first two updates, and is skipped here).
    assert result.error is None and result.steps_seen == 2 + 11
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)
    assert len(steps) == 3
    for s in steps:
        assert count_in(events, s, "Optimizer.step#Adam") == 1


def test_closure_optimizer_step_is_never_cut(tmp_path):
    # LBFGS runs forward and backward inside optimizer.step(closure), and the
    # loop has nothing else: the boundary must fall after the step's range.
    script = write_script(
        tmp_path,
        """
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        for _ in range(10**6):
            opt.step(closure)
        """,
    )
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.error is None and result.stopped_early
    assert result.steps_seen == SMALL.window_steps
    events = trace_events(result.trace_files[0])
    steps = assert_no_straddling(events)  # every Optimizer.step# inside one step
    assert len(steps) == SMALL.active
    for s in steps:
        assert count_in(events, s, "Optimizer.step#LBFGS") == 1
        assert count_in(events, s, "aten::linear") >= 1  # the closure's forwards
