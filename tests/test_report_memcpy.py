"""The copies section: pageable-copy advice fits the copies' direction and stays quiet about time
that does not matter."""

from perfscope.reports.sections import memcpy


def summary(entries, step_ms=100.0, steps=10):
    return {"mode": "gpu", "details": {"memcpy": entries},
            "steps": [{"rank": 0, "step": i, "step_time_us": step_ms * 1000, "counted": True} for i in range(steps)]}


def entry(direction, pageable, count, total_ms):
    return {"direction": direction, "pageable": pageable, "count": count, "total_us": total_ms * 1000, "bytes": None}


def test_a_few_small_device_to_host_copies_are_noted_not_warned_about():
    html = memcpy.render(summary([entry("DtoH", True, 60, 0.11), entry("HtoD", False, 10, 5.0)]))
    assert 'class="warn"' not in html
    assert "60 DtoH copies use pageable host memory" in html and "too little to be worth changing" in html
    assert "DataLoader" not in html


def test_device_to_host_copies_that_cost_get_advice_for_reading_back():
    html = memcpy.render(summary([entry("DtoH", True, 600, 40.0)]))
    assert 'class="warn"' in html and "4.0% of the counted steps" in html
    assert ".item()" in html and "DataLoader" not in html


def test_host_to_device_copies_get_the_dataloader_advice():
    html = memcpy.render(summary([entry("HtoD", True, 10, 50.0)]))
    assert 'class="warn"' in html and "pin_memory=True in the DataLoader" in html


def test_idle_gap_counts_spanning_decades_get_a_log_axis():
    from perfscope.reports.sections import gaps

    h = {"edges_us": [0, 1, 10, 100, 1000, None], "count": [50_000, 900, 30, 2, 1], "total_us": [1, 2, 3, 4, 50_000]}
    html = gaps.render({"mode": "gpu", "details": {"idle_gaps": h}, "overall": {"steps_counted": 3}})
    assert "log scale" in html and ">1,000<" in html and ">100,000<" in html
    assert "≥ 1 ms: 1 gap<" in html  # a bin of one gap is still drawn (and titled) on the log axis
    h["count"] = [5, 9, 3, 2, 1]
    assert "log scale" not in gaps.render({"mode": "gpu", "details": {"idle_gaps": h}})
