"""Chapter 10 and the GPU tests may record a skip where no Vulkan device exists, never where QTTS_REQUIRE_VULKAN is
set (.ci/run sets it after installing lavapipe)."""
import pytest

from qtts_lib.lab import vulkan


def test_device_present_runs():
    ok, why = vulkan.vulkan_or_skip(gpu_count=1, required="1")
    assert ok and why


def test_no_device_is_a_recorded_skip_unless_required():
    ok, why = vulkan.vulkan_or_skip(gpu_count=0, required="")
    assert not ok and "lavapipe" in why


@pytest.mark.parametrize("required", ["true", "1", "yes"])
def test_no_device_when_required_fails(required):
    with pytest.raises(vulkan.VulkanRequired):
        vulkan.vulkan_or_skip(gpu_count=0, required=required)


def test_requirement_read_from_environment(monkeypatch):
    monkeypatch.setenv(vulkan.REQUIRE, "1")
    with pytest.raises(vulkan.VulkanRequired):
        vulkan.vulkan_or_skip(gpu_count=0)
    monkeypatch.delenv(vulkan.REQUIRE)
    ok, why = vulkan.vulkan_or_skip(gpu_count=0)
    assert not ok and "get_gpu_count() == 0" in why


@pytest.mark.parametrize("value", ["0", "false", "no"])
def test_a_false_value_requires_nothing(value):
    assert vulkan.vulkan_or_skip(gpu_count=0, required=value)[0] is False


def test_submission_counts():
    assert vulkan.submissions_per_frame(28, 5) == 238  # 57 + 1 for the talker, 15 x (11 + 1) for the predictor
    assert vulkan.submissions_per_frame(28, 5, rewritten=True) == 18
