"""What each rule family reads and how a person confirms it by hand, for the runbook pages
(scripts/gen_runbooks.py). A rule's own remediation names its commands where it has them;
these are the family's, listed after, so every page has one that matches what it reads."""

from __future__ import annotations

from typing import NamedTuple


class Family(NamedTuple):
    reads: str
    confirm: tuple[str, ...]
    # Xids of the catalog that come with this family's faults (FIELD-NOTES, NVIDIA's catalog)
    xids: tuple[int, ...] = ()


FAMILIES: dict[str, Family] = {
    "driver": Family("NVML's initialisation and system calls, /proc/driver/nvidia/version "
                     "(the kernel module), the loaded modules (/proc/modules) and the "
                     "NVML calls' deadlines.",
                     ("nvidia-smi", "cat /proc/driver/nvidia/version",
                      "lsmod | grep -e nvidia -e nouveau"), (79, 119, 120)),
    "gpu": Family("NVML's device list and per-device identity, against the NVIDIA functions "
                  "on the PCI bus (/sys/bus/pci/devices) and the profile's expected count.",
                  ("nvidia-smi -L", "lspci -d 10de: -nn", "nvidia-smi -q -i <index>"), (79,)),
    "vbios": Family("NVML's VBIOS version of each GPU, against the other GPUs of the same "
                    "model and the profile's allowlist.",
                    ("nvidia-smi --query-gpu=index,name,vbios_version --format=csv",)),
    "ecc": Family("NVML's ECC mode and its volatile and aggregate counters (DRAM and SRAM, "
                  "corrected and uncorrected); the daemon judges their growth per cycle.",
                  ("nvidia-smi -q -d ECC -i <index>",), (48, 63, 92, 94, 95, 140)),
    "memory": Family("NVML's row remapper and retired pages, the memory temperature, the "
                     "compute processes and the memory in use (and the active probe's "
                     "pattern and bandwidth results).",
                     ("nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT -i <index>",
                      "nvidia-smi -q -d MEMORY,TEMPERATURE -i <index>"), (48, 63, 64, 94, 95)),
    "pcie": Family("NVML's PCIe link generation and width (current and maximum), the "
                   "utilization that gates them, the replay counter, and the AER counters "
                   "of the GPU and its bridges in sysfs (/sys/bus/pci/devices/<bus id>/).",
                   ("nvidia-smi --query-gpu=index,pci.bus_id,utilization.gpu,"
                    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
                    "pcie.link.width.max --format=csv",
                    "lspci -vv -s <bus id>"), (79,)),
    "clocks": Family("NVML's clock event reasons (throttle reasons), the SM and memory clocks "
                     "and their maxima, the application clocks and the power draw.",
                     ("nvidia-smi -q -d PERFORMANCE,CLOCK -i <index>",)),
    "power": Family("NVML's enforced and default power limits and the power draw.",
                    ("nvidia-smi -q -d POWER -i <index>",)),
    "thermal": Family("NVML's GPU temperature, its margin to T.Limit and the slowdown and "
                      "shutdown thresholds.",
                      ("nvidia-smi -q -d TEMPERATURE -i <index>",)),
    "persistence": Family("NVML's persistence mode of each GPU and whether nvidia-persistenced "
                          "runs (/proc).",
                          ("nvidia-smi --query-gpu=index,persistence_mode --format=csv",
                           "systemctl status nvidia-persistenced")),
    "recovery": Family("NVML's GPU recovery action field (newer drivers): what the driver "
                       "says the GPU needs.",
                       ("nvidia-smi -q -i <index> | grep -i 'recovery action'",), (154,)),
    "xid": Family("The kernel log (/dev/kmsg): NVRM's Xid lines, each naming its GPU by bus "
                  "address, graded by the Xid catalog (rules/xid.yaml).",
                  ("dmesg -T | grep -e Xid -e NVRM", "gpuguard events --kind xid")),
    "toolkit": Family("The NVIDIA container toolkit's versions (nvidia-ctk, "
                      "nvidia-container-cli info), the CDI specs in /etc/cdi and /var/run/cdi, "
                      "and Docker's runtimes (docker info).",
                      ("nvidia-container-cli info", "nvidia-ctk --version", "nvidia-ctk cdi list",
                       "docker info --format '{{json .Runtimes}}'")),
    "nvlink": Family("NVML's NVLink state and error counters of each link (and the active "
                     "probe's peer copies); the daemon judges counter growth.",
                     ("nvidia-smi nvlink -s -i <index>", "nvidia-smi nvlink -e -i <index>",
                      "nvidia-smi topo -m"), (74, 144, 145, 146, 147, 148, 149, 150)),
    "fabric": Family("NVML's fabric state and status of each GPU (NVSwitch systems) and "
                     "whether nvidia-fabricmanager runs.",
                     ("nvidia-smi -q -i <index> | grep -i -A3 fabric",
                      "systemctl status nvidia-fabricmanager")),
    "p2p": Family("NVML's peer-to-peer status between each pair of GPUs.",
                  ("nvidia-smi topo -p2p r", "nvidia-smi topo -m")),
    "mig": Family("NVML's current and pending MIG mode against the profile.",
                  ("nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending "
                   "--format=csv",)),
    "sxid": Family("The kernel log (/dev/kmsg): the NVSwitch driver's SXid lines, graded by "
                   "the SXid catalog (rules/sxid.yaml).",
                   ("dmesg -T | grep -i sxid",)),
    "host": Family("The host's memory (/proc/meminfo), the out-of-memory kills in the kernel "
                   "log, and the free space of Docker's data root and the model cache.",
                   ("free -h", "df -h <path>",
                    "journalctl -k | grep -i -e 'out of memory' -e oom-kill")),
    "service": Family("The supervised services of the profile: their containers, engine "
                      "metrics and logs, their GPU memory, and a real inference request.",
                      ("gpuguard failover status", "docker ps",
                       "nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv")),
    "image": Family("A container image's or Python environment's CUDA requirement, against "
                    "the driver (gpuguard check --image / --python-env).",
                    ("gpuguard check --image IMAGE --only image.cuda",)),
    "gsp": Family("The kernel log (/dev/kmsg): GSP firmware errors and timeouts that carry "
                  "no Xid.", ("dmesg -T | grep -e GSP -e NVRM",), (119, 120)),
    "devices": Family("The processes stuck in the driver (/proc/<pid>/stat), the device nodes "
                      "/dev/nvidia* and the nvidia-uvm and nvidia-peermem modules.",
                      ("ls -l /dev/nvidia*", "lsmod | grep -e nvidia_uvm -e nvidia_peermem",
                       "ps -eo pid,stat,wchan:32,cmd | awk '$2 ~ /D/'"), (79, 45, 119)),
    "qualify": Family("The readings and results of `gpuguard qualify` (each idle GPU under "
                      "load, results verified, a memory test, copy bandwidths), against the "
                      "model's targets (rules/gpus/).",
                      ("gpuguard qualify", "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE "
                       "-i <index>")),
}

# Read-only commands a rule's remediation may name, by how they start; the others in it
# (a reset, `nvidia-smi -pm 1`, a prune) are what to do, never how to confirm.
READ_ONLY = ("nvidia-smi", "lspci", "dmesg", "journalctl", "cat ", "lsmod", "systemctl status",
             "ps ", "fuser", "docker system df", "du ", "systemd-cgtop",
             "nvidia-container-cli info")
