"""Network partitions between real processes: Linux network namespaces, a bridge, `tc`.

    stores namespace                            node namespaces (workers)
    ┌─────────────────────────────────┐         ┌──────────────┐
    │ br0  10.X.0.1                   │─ veth ──│ eth0 .101  a │
    │   postgres .10  broker .11 ...  │─ veth ──│ eth0 .102  b │
    └─────────────────────────────────┘         └──────────────┘
                  │ veth (never cut): the test process, 10.X.0.254

Every store listens on an address of its own on the bridge, so a node can be cut from
PostgreSQL alone, from the broker alone, or from another node. A cut drops packets
silently, both ways: no RST, no ICMP, the peer's TCP stack sees nothing, as when a switch
or a cable fails. This kernel has neither netem nor iptables, nor tc's `gact`/`matchall`
/`flower`; what it has is HTB, `u32` and the `blackhole` qdisc. So each node's two veth
ends carry an HTB root whose default class passes everything and whose class 1:2 is a
blackhole; `cut(a, b)` adds a `u32` filter sending a's packets to b (on a's end) and b's
packets to a (on the bridge's end of a's link) into that class; `heal` deletes them.

Namespaces are named `rpt<pid>-<name>`: a run's leftovers are recognised by the pid and
removed by the next run (`remove_stale`) when that process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

#: Prefix of every namespace and root-side link this module creates.
PREFIX = "rpt"

#: setns(2) namespace type of a network namespace.
CLONE_NEWNET = 0x40000000


class PartitionError(RuntimeError):
    """Raised when the topology cannot be built or a cut names an unknown endpoint."""


def run(*command: str) -> str:
    """Run one `ip`/`tc` command; its stdout.

    Raises:
        PartitionError: the command failed (its stderr says why).
    """
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PartitionError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def kill_namespace(name: str) -> None:
    """SIGKILL every process inside namespace `name`, then delete it (its links go too)."""
    with contextlib.suppress(PartitionError):
        for pid in run("ip", "netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(PartitionError):
        run("ip", "netns", "del", name)


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; their names."""
    removed = []
    for name in namespaces():
        owner = name[len(PREFIX):].split("-", 1)[0]
        if not name.startswith(PREFIX) or not owner.isdigit():
            continue
        if int(owner) != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            kill_namespace(name)
            removed.append(name)
    return removed


def enter(namespace: str) -> Callable[[], None]:
    """A `preexec_fn` moving the child into `namespace` (before any demotion)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def move() -> None:
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {namespace}")
        finally:
            os.close(fd)

    return move


@dataclass
class Node:
    """One namespace on the bridge: its address and the two ends of its link."""

    name: str
    namespace: str
    address: str
    device: str  # inside the node's namespace
    port: str  # the bridge's end, inside the stores namespace
    cuts: dict[str, int] = field(default_factory=dict)  # peer → filter priority


class Topology:
    """A stores namespace with a bridge, one namespace per node, cuts between any two.

    Args:
        nodes: names of the node namespaces (workers), e.g. ("a", "b").
        stores: names of the store addresses on the bridge, e.g. ("postgres", "broker").

    Raises:
        PartitionError: not root, or `ip`/`tc` refused a step (the half-built topology is
            removed first).
    """

    def __init__(self, nodes: Iterable[str], stores: Iterable[str]) -> None:
        if os.geteuid() != 0:
            raise PartitionError("network namespaces need root")
        self.nodes: dict[str, Node] = {}
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.stores_namespace = f"{self.prefix}-stores"
        self.subnet = self._free_subnet()
        self._node_names = list(nodes)
        self.stores = {name: f"{self.subnet}.{10 + index}" for index, name in enumerate(stores)}

    def _free_subnet(self) -> str:
        routes = run("ip", "-4", "route", "show")
        for step in range(250):
            third = (os.getpid() + step) % 250 + 1
            subnet = f"10.213.{third}"
            if f"{subnet}.0/24" not in routes:
                return subnet
        raise PartitionError("no free 10.213.x.0/24 subnet")

    @property
    def host_address(self) -> str:
        """The test process's address on the bridge."""
        return f"{self.subnet}.254"

    def build(self) -> Topology:
        """Create the namespaces, the bridge, the links and the store addresses."""
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        stores = self.stores_namespace
        run("ip", "netns", "add", stores)
        run("ip", "-n", stores, "link", "set", "lo", "up")
        run("ip", "-n", stores, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", stores, "link", "set", "br0", "up")
        run("ip", "-n", stores, "addr", "add", f"{self.subnet}.1/24", "dev", "br0")
        for address in self.stores.values():
            run("ip", "-n", stores, "addr", "add", f"{address}/24", "dev", "br0")
        # The test process's own link (root namespace), never cut.
        host, peer = f"{self.prefix}h", f"{self.prefix}hp"
        run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", peer, "netns", stores)
        run("ip", "-n", stores, "link", "set", peer, "master", "br0", "up")
        run("ip", "addr", "add", f"{self.host_address}/24", "dev", host)
        run("ip", "link", "set", host, "up")
        for index, name in enumerate(self._node_names):
            namespace = f"{self.prefix}-{name}"
            inner, port = f"{self.prefix}n{index}", f"{self.prefix}p{index}"
            run("ip", "netns", "add", namespace)
            run("ip", "-n", namespace, "link", "set", "lo", "up")
            run("ip", "link", "add", inner, "type", "veth", "peer", "name", port)
            run("ip", "link", "set", port, "netns", stores)
            run("ip", "link", "set", inner, "netns", namespace)
            run("ip", "-n", stores, "link", "set", port, "master", "br0", "up")
            address = f"{self.subnet}.{101 + index}"
            run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
            run("ip", "-n", namespace, "link", "set", inner, "up")
            node = Node(name=name, namespace=namespace, address=address, device=inner,
                        port=port)
            for where, device in ((namespace, inner), (stores, port)):
                _blackhole_class(where, device)
            self.nodes[name] = node

    def address(self, endpoint: str) -> str:
        """The address of a node or a store."""
        if endpoint in self.nodes:
            return self.nodes[endpoint].address
        if endpoint in self.stores:
            return self.stores[endpoint]
        raise PartitionError(f"unknown endpoint {endpoint!r}: nodes {sorted(self.nodes)}, "
                             f"stores {sorted(self.stores)}")

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between `a` and `b` from now on, both ways, silently.

        Args:
            a: a node. b: another node or a store ("stores" for all of them).

        Raises:
            PartitionError: `a` is not a node, or `b` is unknown.
        """
        node = self._node(a)
        for peer in self._peers(b):
            if peer in node.cuts:
                continue
            priority = 10 + len(node.cuts)
            while priority in node.cuts.values():
                priority += 1
            address = self.address(peer)
            run("tc", "-n", node.namespace, "filter", "add", "dev", node.device, "parent", "1:",
                "protocol", "ip", "prio", str(priority), "u32",
                "match", "ip", "dst", f"{address}/32", "flowid", "1:2")
            run("tc", "-n", self.stores_namespace, "filter", "add", "dev", node.port,
                "parent", "1:", "protocol", "ip", "prio", str(priority), "u32",
                "match", "ip", "src", f"{address}/32", "flowid", "1:2")
            node.cuts[peer] = priority

    def heal(self, a: str, b: str) -> None:
        """Let packets between `a` and `b` through again (a no-op when not cut)."""
        node = self._node(a)
        for peer in self._peers(b):
            priority = node.cuts.pop(peer, None)
            if priority is None:
                continue
            for namespace, device in ((node.namespace, node.device),
                                      (self.stores_namespace, node.port)):
                run("tc", "-n", namespace, "filter", "del", "dev", device, "parent", "1:",
                    "protocol", "ip", "prio", str(priority))

    def heal_all(self) -> None:
        """Remove every cut."""
        for node in self.nodes.values():
            for peer in list(node.cuts):
                self.heal(node.name, peer)

    def _node(self, name: str) -> Node:
        if name not in self.nodes:
            raise PartitionError(f"{name!r} is not a node (nodes: {sorted(self.nodes)}); "
                                 "a cut starts at a node")
        return self.nodes[name]

    def _peers(self, endpoint: str) -> list[str]:
        if endpoint == "stores":
            return list(self.stores)
        self.address(endpoint)  # unknown → PartitionError
        return [endpoint]

    def namespace(self, endpoint: str) -> str:
        """The namespace a node's or a store's processes run in."""
        return self._node(endpoint).namespace if endpoint in self.nodes \
            else self.stores_namespace

    def destroy(self) -> None:
        """Kill every process in the topology's namespaces and delete them (idempotent)."""
        for name in namespaces():
            if name.startswith(f"{self.prefix}-"):
                kill_namespace(name)
        with contextlib.suppress(PartitionError):
            run("ip", "link", "del", f"{self.prefix}h")  # gone with its peer, normally


def _blackhole_class(namespace: str, device: str) -> None:
    """An HTB root on `device`: class 1:1 (default) passes, class 1:2 drops everything."""
    tc = ("tc", "-n", namespace)
    run(*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "1",
        "r2q", "100000")
    for minor in ("1", "2"):
        run(*tc, "class", "add", "dev", device, "parent", "1:", "classid", f"1:{minor}",
            "htb", "rate", "10gbit")
    run(*tc, "qdisc", "add", "dev", device, "parent", "1:2", "handle", "2:", "blackhole")
