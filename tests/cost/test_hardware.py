"""The hardware catalog: sourced figures, ridge points, lookups, and measuring this machine."""

import pytest

from rlm_course.cost.hardware import copy_bandwidth, get_device, load_catalog, measure_this_machine

ACCELERATORS = ("A100-SXM-80GB", "H100-SXM-80GB", "H200-SXM-141GB", "B200-HGX-180GB",
                "MI300X-192GB")


def test_every_accelerator_has_positive_figures_and_a_source():
    catalog = load_catalog()
    for name in ACCELERATORS:
        d = catalog[name]
        assert min(d.peak_flops, d.memory_bytes, d.memory_bandwidth, d.intra_node_bandwidth,
                   d.inter_node_bandwidth) > 0, name
        assert "datasheet" in d.source, name


def test_link_bandwidths_are_per_direction_and_latencies_come_with_them():
    # an H100's NVLink is 900 GB/s counting both directions: 450 GB/s each way is the beta of a
    # ring step; a 400 Gb/s NIC is 50 GB/s each way
    h100 = get_device("H100-SXM-80GB")
    assert h100.intra_node_bandwidth == 450e9 and h100.inter_node_bandwidth == 50e9
    assert get_device("A100-SXM-80GB").intra_node_bandwidth == 300e9
    assert get_device("B200-HGX-180GB").intra_node_bandwidth == 900e9
    for name in ACCELERATORS:
        d = load_catalog()[name]
        assert 0 < d.intra_node_latency < d.inter_node_latency < 1e-4, name
        assert d.inter_node_bandwidth < d.intra_node_bandwidth, name


def test_an_mi300x_node_is_a_mesh_where_a_pair_talks_over_one_link():
    """Infinity Fabric on the MI300X platform: 7 links of 64 GB/s a direction a GPU, one to each
    other GPU; NVSwitch gives every group the whole 450 GB/s."""
    from rlm_course.cost.comm import Fabric, Link, p2p_seconds

    mi300x, h100 = get_device("MI300X-192GB"), get_device("H100-SXM-80GB")
    assert (mi300x.intra_node_links, h100.intra_node_links) == (7, 0)
    mesh, switch = Fabric.of(mi300x), Fabric.of(h100)
    assert [mesh.link(g).beta for g in (2, 4, 8)] == pytest.approx([64e9, 192e9, 448e9])
    assert mesh.link(2, stride=4).beta == pytest.approx(64e9)  # any pair: one direct link
    assert [switch.link(g).beta for g in (2, 4, 8)] == [450e9] * 3
    assert mesh.link(16) is mesh.inter  # across nodes: the network, as before
    # a pipeline hop of 1 GB between two MI300X: 1e9 / 64e9 s, not / 448e9
    assert p2p_seconds(1e9, mesh.link(2)) == pytest.approx(3.4e-6 + 1e9 / 64e9)
    # a point-to-point hop (a pipeline stage's activations, a ring-attention block) crosses one
    # link whatever the group: 64 GB/s for pp 8 inside the node, the network across nodes
    assert mesh.p2p_link(8).beta == pytest.approx(64e9) and switch.p2p_link(8).beta == 450e9
    assert mesh.p2p_link(4, stride=4) is mesh.inter
    from rlm_course.cost.layouts import Layout
    from rlm_course.cost.phases import Rates, TrainerCost
    from rlm_course.rl.algorithms import preset
    from rlm_course.cost.architectures import get_spec
    spec = get_spec("llama-3.1-70b")
    trainer = TrainerCost(spec, preset("grpo"), Layout(pp=8, cp=1, recompute=True), mi300x,
                          Rates(), mesh, 512)
    assert trainer.links["pp"].beta == pytest.approx(64e9)
    # a colocated reshard gathers from the group's other devices over their links: TP 4 to
    # generation TP 2 takes a device's missing half of its shard (4.0 GB) from one peer
    from rlm_course.cost.weight_sync import sync_cost
    gather = sync_cost(get_spec("llama-3.1-8b"), mi300x, "colocated", generation_tp=2,
                       replicas=4, trainer=Layout(tp=4, dp=2)).gather
    assert gather == pytest.approx(3.4e-6 + 8.03e9 / 2 / 64e9, rel=1e-3)
    # a measured intra-node link is what the node's groups reach: no mesh on top of it
    measured = Fabric.of(mi300x, intra=Link(5e-6, 300e9))
    assert measured.mesh_links == 0 and measured.link(2).beta == 300e9
    with pytest.raises(ValueError, match="mesh_links=3 must be 0 \\(a switch\\) or "
                                         "devices_per_node - 1 = 7"):
        Fabric(Link(1e-6, 1e9), None, 8, 3)
    import dataclasses
    for links in (-1, 3, 8):  # only a switch or a full mesh of the node
        with pytest.raises(ValueError, match=f"intra_node_links={links} must be 0"):
            dataclasses.replace(mi300x, intra_node_links=links)


def test_ridge_points_match_the_published_arithmetic():
    # H100 SXM: 989 TFLOP/s / 3.35 TB/s ~ 295 FLOP/B; H200: 989 / 4.8 ~ 206 (JAX scaling book)
    assert get_device("H100-SXM-80GB").ridge_point == pytest.approx(295, abs=1)
    assert get_device("H200-SXM-141GB").ridge_point == pytest.approx(206, abs=1)
    assert get_device("A100-SXM-80GB").ridge_point == pytest.approx(153, abs=1)


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown device 'H1000'.*H100-SXM-80GB"):
        get_device("H1000")
    # a name in another case is the same device, not an unknown one
    assert get_device("h100-sxm-80gb") == get_device("H100-SXM-80GB")


def test_measuring_this_machine_gives_plausible_figures():
    device = measure_this_machine(write=False)
    assert 1e8 < device.peak_flops < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s for a CPU
    assert 1e8 < device.memory_bandwidth < 1e13
    assert device.ridge_point > 0 and "measured by" in device.source
    assert copy_bandwidth(megabytes=8, repeats=2) > 1e8


def _catalog_copy(tmp_path, monkeypatch):
    """A copy of the hardware catalog the course reads instead of its own; its folder."""
    import shutil

    from rlm_course.cost.hardware import catalog_dir

    data = tmp_path / "data"
    shutil.copytree(catalog_dir(), data / "hardware")
    monkeypatch.setenv("RLM_COURSE_DATA", str(data))
    return data / "hardware"


def test_a_corrupt_local_measurement_is_a_clear_error(tmp_path, monkeypatch):
    (_catalog_copy(tmp_path, monkeypatch) / "this-machine.json").write_text("{not json")
    with pytest.raises(ValueError, match="this-machine.json is unreadable"):
        load_catalog()


def test_a_reported_memory_far_from_the_datasheet_is_refused(tmp_path, monkeypatch):
    import json

    catalog = _catalog_copy(tmp_path, monkeypatch)
    (catalog / "this-machine.json").unlink(missing_ok=True)
    path = catalog / "accelerators.json"
    doc = json.loads(path.read_text())
    for bad in (-1.0, 85e12):
        doc["devices"]["H100-SXM-80GB"]["reported_memory_bytes"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="'H100-SXM-80GB': reported_memory_bytes=.* must be "
                                             "the total CUDA reports"):
            load_catalog()


def test_a_device_with_a_figure_no_device_has_is_refused_by_name():
    from dataclasses import replace

    from rlm_course.cost.hardware import get_device

    h100 = get_device("H100-SXM-80GB")
    for field, value, message in (("peak_flops", 0.0, "peak_flops=0.0 must be positive"),
                                  ("memory_bandwidth", float("nan"), "memory_bandwidth=nan"),
                                  ("memory_bytes", -1.0, "memory_bytes=-1.0 must be positive"),
                                  ("inter_node_bandwidth", -5.0, "inter_node_bandwidth=-5.0 must be finite and >= 0"),
                                  ("devices_per_node", 0, "devices_per_node=0 must be a positive"),
                                  ("devices_per_host", -1, "devices_per_host=-1 must be an integer >= 0"),
                                  ("devices_per_host", 2.5, "devices_per_host=2.5 must be an integer"),
                                  ("devices_per_host", True, "devices_per_host=True must be an integer")):
        with pytest.raises(ValueError, match=f"Device 'H100-SXM-80GB': {message}"):
            replace(h100, **{field: value})
    # a host's devices default to the node's; a GB200 NVL72 rack's hosts are its trays of four
    assert h100.devices_per_host == 0 and h100.host_devices == 8
    assert get_device("GB200-NVL72-186GB").host_devices == 4


def test_a_measurement_on_a_busy_machine_says_its_figures_are_low(monkeypatch, capsys):
    import os

    from rlm_course.cli import main
    from rlm_course.cost import hardware

    measured = []
    monkeypatch.setattr(hardware, "measure_this_machine",
                        lambda: measured.append(1) or get_device("H100-SXM-80GB"))
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 1.2, 0.9))
    assert main(["hardware", "--measure"]) == 0
    out = capsys.readouterr().out
    assert measured == [1]
    assert ("Note: the machine was busy when measured (load average 1.6 on "
            f"{os.cpu_count()} cores)") in out and "measure again when it is idle" in out
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert main(["hardware", "--measure"]) == 0
    assert "busy" not in capsys.readouterr().out


def test_the_hardware_table_says_whose_machine_this_machine_is(capsys):
    """The catalog's this-machine row is the course's reference machine until a learner
    measures their own: the table says so, from the entry's source, under it."""
    from rlm_course.cli import main
    from rlm_course.cost.hardware import load_catalog

    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    source = load_catalog()["this-machine"].source
    assert f"\nthis-machine: {source}\n" in out
