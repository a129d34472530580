"""Config loading: the DESIGN.md example loads, env overrides apply once, mistakes get fix-it errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzyd.config import CONFIG_REFERENCE, KEYS, HostPort, load_config
from frenzyd.errors import ConfigError

EXAMPLE = """
[node]
name = "ws-01"
data_dir = "/var/lib/frenzy"
priority = 0

[network]
listen = "0.0.0.0:7470"
interfaces = ["eth0"]
peers = []
mdns = true

[pool]
credentials = "/etc/frenzy/node"

[client]
listen = "unix:/run/frenzy/client.sock"

[web]
listen = "127.0.0.1:7480"

[[devices]]
type = "A100-80GB"
count = 2
"""

MIN = """
[node]
name = "n1"
data_dir = "data"
[pool]
credentials = "creds"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "frenzyd.toml"
    p.write_text(text)
    return p


def _no_if(name: str) -> str | None:
    return {"eth0": "10.1.2.3"}.get(name)


def test_design_example_loads(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, EXAMPLE), {}, ifaddr=_no_if)
    assert cfg.node.name == "ws-01"
    assert cfg.node.data_dir == Path("/var/lib/frenzy")
    assert cfg.network.listen == HostPort("0.0.0.0", 7470)
    assert cfg.network.interfaces == ("eth0",)
    assert cfg.network.advertise == "10.1.2.3"  # first IPv4 of the first interface
    assert cfg.network.advertise_address == "10.1.2.3:7470"
    assert cfg.pool.credentials == Path("/etc/frenzy/node")
    assert cfg.client.unix_path == Path("/run/frenzy/client.sock")
    assert cfg.web.listen == HostPort("127.0.0.1", 7480)
    assert [(d.type, d.count, d.memory_gib) for d in cfg.devices] == [("A100-80GB", 2, None)]
    assert cfg.timing.heartbeat_s == 1.0
    assert cfg.timing.peer_timeout_s == 4.0


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, MIN), {}, ifaddr=_no_if)
    assert cfg.node.data_dir == tmp_path / "data"
    assert cfg.pool.credentials == tmp_path / "creds"
    assert cfg.client.listen == f"unix:{tmp_path / 'data' / 'client.sock'}"
    assert cfg.devices == ()
    assert cfg.network.mdns is True
    assert cfg.network.advertise  # some concrete host, never None
    assert cfg.timing.election_grace_s == cfg.timing.peer_timeout_s
    assert cfg.launcher.rendezvous_ports == (29400, 29499)


def test_listen_host_is_advertised_when_no_interface(tmp_path: Path) -> None:
    text = MIN + '[network]\nlisten = "127.0.0.7:9000"\n'
    cfg = load_config(_write(tmp_path, text), {}, ifaddr=_no_if)
    assert cfg.network.advertise_address == "127.0.0.7:9000"


def test_env_overrides_apply(tmp_path: Path) -> None:
    env = {
        "FRENZY_DATA_DIR": str(tmp_path / "elsewhere"),
        "FRENZY_PEERS": "10.0.0.2:7470, [fd00::3]:7470",
        "FRENZY_MDNS": "0",
        "FRENZY_PRIORITY": "5",
        "FRENZY_LISTEN": "127.0.0.1:0",
        "UNRELATED": "x",
    }
    cfg = load_config(_write(tmp_path, MIN), env, ifaddr=_no_if)
    assert cfg.node.data_dir == tmp_path / "elsewhere"
    assert cfg.network.peers == (HostPort("10.0.0.2", 7470), HostPort("fd00::3", 7470))
    assert str(cfg.network.peers[1]) == "[fd00::3]:7470"
    assert cfg.network.mdns is False
    assert cfg.node.priority == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[node]\nname='a'\n", "data_dir is required"),
        (MIN.replace('name = "n1"', 'name = "bad name"'), "letters, digits"),
        (MIN + "[nodee]\n", r"did you mean \[node\]"),
        (MIN + "[network]\nlisen = '0.0.0.0:1'\n", "did you mean 'listen'"),
        (MIN + "[network]\nlisten = '7470'\n", "not host:port"),
        (MIN + "[network]\nlisten = '0.0.0.0:99999'\n", "0..65535"),
        (MIN + "[network]\npeers = 'x'\n", "not host:port"),
        (MIN + "[network]\npeers = [1]\n", "list of strings"),
        (MIN + "[network]\nmdns = 'maybe'\n", "true or false"),
        (MIN + "[client]\nlisten = '0.0.0.0:7471'\n", "loopback only"),
        (MIN + "[[devices]]\ntype = 'A100'\n", "did you mean"),
        (MIN + "[[devices]]\ntype = 'A100-80GB'\ncount = 0\n", "count"),
        (MIN + "[timing]\nheartbeat_s = 3\npeer_timeout_s = 4\n", "at least twice"),
        (MIN + "[timing]\nheartbeat_s = -1\n", "heartbeat_s"),
        (MIN + "[launcher]\nrendezvous_ports = [30000, 29000]\n", "LOW <= HIGH"),
        (MIN + "[owner]\nmin_free_fraction = 2\n", "min_free_fraction"),
        (MIN + "[jobs]\npolicy = 'frenzzy'\n", "use one of frenzy, fifo"),
        ("[node\n", "not valid TOML"),
        (MIN + "devices = 3\n", "unknown key"),  # lands in [pool]: a typo, not a silent default
    ],
)
def test_mistakes_get_fix_it_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, text), {}, ifaddr=_no_if)


def test_unknown_device_type_with_memory_is_accepted(tmp_path: Path) -> None:
    text = MIN + "[[devices]]\ntype = 'MI300X'\ncount = 8\nmemory_gib = 192\n"
    cfg = load_config(_write(tmp_path, text), {}, ifaddr=_no_if)
    assert cfg.devices[0].memory_gib == 192.0


def test_missing_file_says_where_the_example_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"frenzyd\.toml\.example"):
        load_config(tmp_path / "nope.toml", {})


def test_reference_lists_every_key_and_the_example_file_loads(root: Path, tmp_path: Path) -> None:
    for section, key, _, doc in KEYS:
        assert f"`{section}.{key}`" in CONFIG_REFERENCE
        assert doc
    example = root / "systemd" / "frenzyd.toml.example"
    cfg = load_config(example, {}, ifaddr=_no_if)
    assert cfg.node.name


def test_the_live_policy_names_are_the_schedulers_built_ins() -> None:
    from frenzyd.config import LIVE_POLICIES
    from frenzyd.has.registry import BUILTIN

    assert set(LIVE_POLICIES) == set(BUILTIN)


def test_the_jobs_section_sets_the_live_scheduler(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, MIN + "[jobs]\npolicy = 'fifo'\nmin_run_s = 5.0\n"), {}, ifaddr=_no_if)
    assert (cfg.jobs.policy, cfg.jobs.min_run_s) == ("fifo", 5.0)
    assert load_config(_write(tmp_path, MIN), {}, ifaddr=_no_if).jobs.policy == "frenzy"


def test_the_restart_costs_a_coordinator_starts_from_are_configurable(tmp_path: Path) -> None:
    from frenzyd.jobs.placement import DEFAULT_START_S, DEFAULT_STOP_S

    jobs = load_config(_write(tmp_path, MIN), {}, ifaddr=_no_if).jobs
    assert (jobs.restart_start_s, jobs.restart_stop_s) == (DEFAULT_START_S, DEFAULT_STOP_S)
    cfg = load_config(_write(tmp_path, MIN + "[jobs]\nrestart_start_s = 9.5\nrestart_stop_s = 0\n"), {},
                      ifaddr=_no_if)
    assert (cfg.jobs.restart_start_s, cfg.jobs.restart_stop_s) == (9.5, 0.0)
    with pytest.raises(ConfigError, match="restart_start_s"):
        load_config(_write(tmp_path, MIN + "[jobs]\nrestart_start_s = -1\n"), {}, ifaddr=_no_if)


def test_the_readme_configuration_reference_states_the_loaders_defaults(tmp_path: Path) -> None:
    """Every row of the README's configuration reference whose default is a literal (`4.0`, `"swim"`,
    `[]`) names the value a minimal config loads to (placeholders such as DATA_DIR filled in)."""
    import json
    import re

    from frenzyd.config import config_from_dict

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("### Configuration reference"):readme.index("## Architecture")]
    rows = re.findall(r"^\| `([a-z_]+)\.([a-z_0-9]+)` \| `([^`]*)` \|", table, re.M)
    (tmp_path / "creds").mkdir()
    data = tmp_path / "data"
    cfg = config_from_dict({"node": {"name": "x", "data_dir": str(data)},
                            "pool": {"credentials": str(tmp_path / "creds")}}, {}, base=tmp_path)
    checked = 0
    for section, key, text in rows:
        try:
            want = json.loads(text.replace("DATA_DIR", str(data)))
        except json.JSONDecodeError:
            continue  # a word ("required", "auto"): described, not a value
        if section == "devices":  # a list of tables: each entry's own defaults, not the config's
            continue
        attr = {("launcher", "stop_grace_s"): "term_grace_s"}.get((section, key), key)  # renamed key
        got = getattr(getattr(cfg, section), attr)
        got = list(got) if isinstance(got, tuple) else got
        got = str(got) if isinstance(got, HostPort) else got
        if want == {} and got == []:  # an empty table of overrides, loaded as an empty tuple of pairs
            continue
        assert want == got, f"README says {section}.{key} = {text}, the loader gives {got!r}"
        checked += 1
    assert checked >= 40
