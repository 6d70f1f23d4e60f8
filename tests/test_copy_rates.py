"""The host's copy rates: None without CUDA, read back from the per-host cache once measured, and on the pages."""

import json

from lab.results.schema import Environment
from lab.run import copy_rates


def test_no_rates_without_cuda():
    assert copy_rates.rates("cpu") is None


def test_a_stored_measurement_is_read_back_and_a_damaged_one_is_not(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(copy_rates, "_measured", {})
    stored = {"h2d_pageable": 8.4, "h2d_pinned": 55.1, "d2h_new_pageable": 1.5, "d2h_kept_pageable": 15.7,
              "d2h_pinned": 55.3}
    path = copy_rates._cache_file(copy_rates._host_key("NVIDIA H200"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(stored))
    assert copy_rates.rates("cuda") == stored
    measured = []
    monkeypatch.setattr(copy_rates, "measure", lambda device: measured.append(device) or {k: 1.0 for k in stored})
    monkeypatch.setattr(copy_rates, "_measured", {})
    path.write_text(json.dumps({**stored, "d2h_pinned": -1}))  # damaged: measured afresh, and stored again
    assert copy_rates.rates("cuda") == {k: 1.0 for k in stored} and len(measured) == 1
    assert json.loads(path.read_text()) == {k: 1.0 for k in stored}
    assert copy_rates.rates("cuda:0") == {k: 1.0 for k in stored} and len(measured) == 1  # once per process


def test_an_ab_page_shows_the_recorded_rates():
    from lab.pages.limits_report import copy_rates_lines

    env = Environment(device="cuda", copy_rates={"h2d_pageable": 8.4, "h2d_pinned": 55.1, "d2h_new_pageable": 1.5,
                                                 "d2h_kept_pageable": 15.7, "d2h_pinned": 55.3})
    line = copy_rates_lines(env)[0]
    assert "8.4 from pageable" in line and "1.5 into new pageable" in line and "55.3 into pinned" in line
    assert copy_rates_lines(Environment(device="cpu")) == []
