"""The daemon judges the PyTorch of an exec service's Python environment (`python_env`,
issue 24) every slow cycle, live on the fake NVML reporting an older driver: caught
before the next restart, named for its service."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cuda_images import pytorch


def test_the_pytorch_of_a_supervised_service_is_judged(start_daemon, fake_env, tmp_path: Path):
    env_dir = pytorch(tmp_path / "venv", "2.9.0+cu130", "13.0")
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "batch", "backend": "exec", "python_env": str(env_dir), "gpus": [0],
        "probe": {"exec": ["true"], "timeout": 5},
        "exec": {"start_gpu": ["true"], "stop_gpu": ["true"], "start_cpu": ["true"],
                 "stop_cpu": ["true"], "running_gpu": ["true"], "running_cpu": ["false"]}}]}))
    daemon = start_daemon("--config", str(config), "--fast-interval", "1",
                          env=fake_env(driver_version="550.54.15", cuda_version=12040))
    result = daemon.wait_for(lambda: daemon.result("image.cuda"), what="image.cuda")
    assert result["status"] == "critical", result["message"]
    assert result["observed"]["service_status"] == {"batch": "critical"}
    assert result["message"].startswith(f"batch (PyTorch 2.9.0+cu130 in {env_dir} needs CUDA "
                                        "13.0; driver 550.54.15 gives CUDA 12.4")
    assert 'gpuguard_rule_status{gpu="",pci_bus_id="",rule="image.cuda",severity="critical",' \
           'uuid=""} 2.0' in daemon.metrics()
