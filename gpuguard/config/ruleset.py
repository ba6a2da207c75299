"""Load rules: the default pack, user rule directories, and overrides; all validated.

Rule files are YAML with a top-level `rules:` list (new rules) and/or an
`overrides:` mapping (rule id -> severity/enabled/thresholds/remediation). The
default pack holds the rules whose logic is Python (`gpuguard/checks/`); user
files may add rules without code through a `when:` condition. Anything wrong
raises ConfigError naming the file and the line, before a single rule runs.
"""

from __future__ import annotations

from pathlib import Path

from gpuguard.config.profile import load_profile
from gpuguard.config.yamlfile import ConfigError, Mapping
from gpuguard.judge import registry
from gpuguard.model.profile import Profile
from gpuguard.model.rule import Rule, RuleSet

# The full loader (config/rule_files.py: msgspec and the schema) is imported only where
# a file is read the full way: the shipped pack comes from its compiled form
# (config/pack_cache.py) while that matches its YAML files.


def default_pack_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # gpuguard/
    shipped = package / "_rules"  # inside an installed wheel
    return shipped if shipped.is_dir() else package.parent / "rules"


def load_ruleset(
    user_dirs: list[Path] | None = None,
    profile_overrides: tuple[Path, Mapping] | None = None,
    pack_dir: Path | None = None,
) -> RuleSet:
    registry.load_all()
    ruleset = _load_pack(pack_dir or default_pack_dir())
    missing = (set(registry.HOST_CHECKS) | set(registry.GPU_CHECKS)) - set(ruleset.rules)
    if missing:
        raise ConfigError(pack_dir or default_pack_dir(), None,
                          f"checks without a rule in the pack: {', '.join(sorted(missing))}")
    for rule in ruleset.rules.values():
        _check_declared_thresholds(rule)
    user_files = [path for directory in user_dirs or [] for path in _yaml_files(directory)]
    if user_files or profile_overrides:
        from gpuguard.config import rule_files

        for path in user_files:
            rule_files.load_file(ruleset, path, default_pack=False)
        if profile_overrides:
            path, overrides = profile_overrides
            # load_profile has checked them already; converted here for their parsed values
            specs = rule_files.convert_overrides(overrides, path)
            rule_files.apply_overrides(ruleset, path, specs, overrides)
    return ruleset


def _load_pack(pack_dir: Path) -> RuleSet:
    """The pack from its compiled form where that matches its files, else the full way
    (which then names the file and line of what is wrong)."""
    from gpuguard.config.pack_cache import load_cached

    paths = _yaml_files(pack_dir)
    cached = load_cached(pack_dir, paths)
    if cached is not None:
        return cached
    return load_pack_in_full(pack_dir, paths)


def load_pack_in_full(pack_dir: Path, paths: list[Path] | None = None) -> RuleSet:
    """The pack read through the schema, every check made (the slow path; and what
    scripts/gen_pack_cache.py compiles)."""
    from gpuguard.config import rule_files

    ruleset = RuleSet()
    for path in _yaml_files(pack_dir) if paths is None else paths:
        rule_files.load_file(ruleset, path, default_pack=True)
    return ruleset


def _check_declared_thresholds(rule: Rule) -> None:
    """The pack's file declares exactly the thresholds its check reads: one it reads but the
    file lacks would fail at run time, one it declares but never reads misleads."""
    wanted = set(registry.THRESHOLDS.get(rule.id, ()))
    have = set(rule.thresholds)
    path, _, line = rule.origin.rpartition(":")
    if wanted - have:
        raise ConfigError(path, int(line), f"{rule.id}: its check reads threshold(s) "
                          f"{', '.join(sorted(wanted - have))}, which this file does not declare")
    if have - wanted:
        raise ConfigError(path, int(line), f"{rule.id}: threshold(s) "
                          f"{', '.join(sorted(have - wanted))} are declared but its check "
                          "never reads them")


def load_config(profile_path: Path | None,
                rules_dirs: list[Path]) -> tuple[Profile, RuleSet]:
    """The profile and the rules in force: the pack, the user's directories, then the
    profile's overrides. `check` and the daemon (also on SIGHUP) load through here."""
    profile = load_profile(profile_path) if profile_path is not None else Profile()
    overrides = (profile.path, profile.rule_overrides) \
        if profile.path is not None and profile.rule_overrides is not None else None
    return profile, load_ruleset(rules_dirs, overrides)


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise ConfigError(directory, None, "rules directory does not exist")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    for path in files:
        if not path.is_file():  # a FIFO or a folder named *.yaml is not skipped in silence
            raise ConfigError(path, None, "not a regular file")
    return files


