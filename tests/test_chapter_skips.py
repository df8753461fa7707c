"""Chapter 08 may record a skip where no Vulkan device exists, never in CI (CI installs lavapipe)."""
import pytest

from qtts_lib import bench


def test_device_present_runs():
    ok, why = bench.vulkan_or_skip(gpu_count=1, ci="true")
    assert ok and why


def test_no_device_outside_ci_is_a_recorded_skip():
    ok, why = bench.vulkan_or_skip(gpu_count=0, ci="")
    assert not ok and "lavapipe" in why


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_no_device_in_ci_fails(ci):
    with pytest.raises(bench.NoVulkanInCI):
        bench.vulkan_or_skip(gpu_count=0, ci=ci)


def test_ci_read_from_environment(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(bench.NoVulkanInCI):
        bench.vulkan_or_skip(gpu_count=0)
    monkeypatch.delenv("CI")
    assert bench.vulkan_or_skip(gpu_count=0) == (False, bench.vulkan_or_skip(gpu_count=0, ci="")[1])


def test_ci_false_is_not_ci():
    assert bench.vulkan_or_skip(gpu_count=0, ci="false")[0] is False


def test_submission_counts():
    assert bench.submissions_per_frame(28, 5) == 254
    assert bench.submissions_per_frame(28, 5, rewritten=True) == 18
