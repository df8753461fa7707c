"""Looking for a Vulkan device prints nothing: ncnn's C-level "dlopen failed libvulkan.so.1" lines (written to file
descriptor 2 on a machine without a Vulkan driver) are captured by `runtime.binding.net.vulkan_devices` and turned
into a reason, so chapters and benchmark results that describe the machine show none of them."""
import os
import subprocess
import sys

PROBE = ("from qtts_lib.runtime.binding.net import vulkan_devices, gpu_names\n"
         "from qtts_lib.bench.machine import gpus\n"
         "names, why = vulkan_devices()\n"
         "assert gpu_names() == names and (bool(names) != bool(why)), (names, why)\n"
         "gpus()\n"
         "print('devices', len(names), why)\n")


def test_no_driver_prints_nothing_and_gives_a_reason():
    env = os.environ | {"VK_DRIVER_FILES": "/nonexistent", "VK_ICD_FILENAMES": "/nonexistent"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.startswith("devices 0 ") and len(done.stdout.split()) > 3, done.stdout
