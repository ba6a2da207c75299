from gpuguard.sources import sysfs
from tests.conftest import FIXTURES

S = FIXTURES / "sysfs-aer"


def test_chain_walks_from_gpu_to_root_port():
    chain = sysfs.aer_chain(S, "00000000:3B:00.0").get()
    assert [(d["address"], d["role"]) for d in chain] == [
        ("0000:3b:00.0", "gpu"), ("0000:3a:00.0", "bridge"), ("0000:00:01.0", "root_port")]
    bridge = chain[1]
    assert bridge["nonfatal"] == {"CmpltTO": 3, "TOTAL": 3}
    assert bridge["correctable"] == {"RxErr": 240, "BadTLP": 12, "TOTAL": 252}
    assert chain[0]["fatal"] == {"TOTAL": 0}


def test_missing_files_are_not_supported_not_healthy():
    reading = sysfs.aer_chain(S, "0000:5e:00.0")
    assert reading.state == "not_supported"
    assert "VMs" in (reading.error or "")


def test_unknown_device_is_an_error():
    reading = sysfs.aer_chain(S, "0000:99:00.0")
    assert reading.state == "error"


def test_malformed_counter_file_names_the_file(tmp_path):
    import shutil

    tree = tmp_path / "sys"
    shutil.copytree(S, tree, symlinks=True)
    bad = tree / "devices/pci0000:80/0000:80:03.0/0000:86:00.0/aer_dev_fatal"
    bad.write_text("Undefined 0\nDLP zero\n")
    reading = sysfs.aer_chain(tree, "0000:86:00.0")
    assert reading.state == "error"
    assert f"{bad}:2: expected `NAME count`" in (reading.error or "")


def test_unreadable_counter_file(tmp_path):
    import shutil

    tree = tmp_path / "sys"
    shutil.copytree(S, tree, symlinks=True)
    node = tree / "devices/pci0000:80/0000:80:03.0/0000:86:00.0"
    (node / "aer_dev_fatal").unlink()
    (node / "aer_dev_fatal").mkdir()  # reading it fails even as root
    reading = sysfs.aer_chain(tree, "0000:86:00.0")
    assert reading.state == "error" and "cannot read" in (reading.error or "")


def test_secure_boot():
    assert sysfs.secure_boot(S).get() is True
    assert sysfs.secure_boot(FIXTURES / "nowhere").state == "not_supported"
