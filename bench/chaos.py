"""Crash suite: real processes on one private PostgreSQL, SIGKILLed at random and restarted; then a check.

    nice -n 10 python -m bench.chaos                    # 50 kill cycles, every 3 s, PostgreSQL every 7th
    python -m bench.chaos --cycles 8 --interval 1.5     # the short version the test suite runs

Runs 2 API processes, 2 score workers, 2 producers (client-chosen group ids, retrying each post until it
is answered), 3 trainer-like consumers (lease with a request_id, "train", ack, all retried) and a killer
that SIGKILLs one random process every ``--interval`` seconds and restarts it. Every ``--pg-every``-th
cycle it kills PostgreSQL itself: a private cluster made with ``initdb`` in a temporary directory, on its
own port (never the machine's server). Producers mix in poison groups: token-less ones (curation must
keep them from trainers) and ones whose reward component always errors (retried, then dropped).

The last kill SIGKILLs an API process and a score worker together while the producers post; from then
on every group the API acknowledged must be scored and curated (ready, leased or final) within 120 s
(claims keep their default 30 s, renewed every 10 s: a dead worker's groups are claimed again when its
claims expire); the run names the groups that are not, with their status.

After that everything runs undisturbed for a drain period; then the checker reads the database,
the producers' logs and the consumers' logs (what each trained, with content hashes) and prints: cycles,
groups acknowledged by the API, lost (acknowledged but absent or different, or a good group that did not
end consumed / dropped by a curation rule), duplicated (by content), stuck (not final after the drain),
consumed twice, trained twice (by one consumer; in all), trained with other content, consumed but never
trained, and how each poison group ended. Exit status 0 iff all but "trained twice in all" are 0 and
nothing was unsettled 120 s after the last kill (docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FINAL = ("consumed", "dropped", "reward_error", "curation_error")
# Scoring *failures* retry fast here (the poison groups' judge is down: their backoff is not what is tested);
# claims keep their deployed default (score_claim_seconds 30, heartbeat every 10 s), so "final within
# SETTLE_S after the last kill" measures how fast a dead worker's claims really come back.
WORKER_ENV = {"GRPO_CURATOR_MAX_SCORE_ATTEMPTS": "4", "GRPO_CURATOR_SCORE_BACKOFF_BASE_S": "0.2",
              "GRPO_CURATOR_SCORE_BACKOFF_MAX_S": "1", "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.2"}
LEASE_SECONDS = 4.0
SETTLE_S = 120.0  # every acknowledged group is scored and curated this long after the last kill (issue 26)
SETTLED = ("ready", "leased", *FINAL)  # scored and curated: what a trainer can lease, or an end


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the private PostgreSQL ------------------------------------------------------------------------------
class PrivatePostgres:
    """A throw-away cluster (initdb) on its own port; run as the ``postgres`` user when we are root."""

    def __init__(self, root: Path) -> None:
        self.data, self.port = root / "pgdata", free_port()
        self.log = root / "postgres.log"
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.prefix, *cmd], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> None:
        self.data.mkdir(parents=True)
        if self.prefix:
            shutil.chown(self.data, "postgres")
            shutil.chown(self.data.parent, "postgres")
            self.data.parent.chmod(0o755)
        self._run(shutil.which("initdb") or "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust")
        self.start()

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=on"
        for _ in range(50):  # after a SIGKILL the old backends may need a moment to notice and exit
            try:
                self._run(shutil.which("pg_ctl") or "pg_ctl", "-D", str(self.data), "-l", str(self.log),
                          "-o", opts, "-w", "-t", "60", "start")
                return
            except subprocess.CalledProcessError:
                time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL did not restart; see {self.log}")

    def pid(self) -> int | None:
        pidfile = self.data / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster (a crash: no shutdown checkpoint), wait for its backends, restart."""
        pid = self.pid()
        if pid is not None:
            children = _children(pid)
            os.kill(pid, signal.SIGKILL)
            for child in children:  # they exit on their own once they see the postmaster gone
                _wait_gone(child, 10)
        self.start()

    def stop(self) -> None:
        subprocess.run([*self.prefix, shutil.which("pg_ctl") or "pg_ctl", "-D", str(self.data), "-m", "immediate",
                        "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)


# -- the processes ---------------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    kills: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:  # its own session: a kill takes its whole process tree
            self.popen = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=out,
                                          start_new_session=True)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


@dataclass
class Cluster:
    root: Path
    pg: PrivatePostgres
    procs: list[Proc] = field(default_factory=list)
    api_urls: list[str] = field(default_factory=list)


# the poison spec's judge: a deployment endpoint nobody listens on (connection refused: a component error)
DOWN_JUDGE = json.dumps({"down": {"url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 0, "timeout_s": 2}})


def _env(url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": url, "GRPO_CURATOR_LOG_LEVEL": "warning",
            "GRPO_CURATOR_EMBEDDED_WORKER": "false", "GRPO_CURATOR_JUDGE_ENDPOINTS": DOWN_JUDGE, **extra}


def build(root: Path) -> Cluster:
    pg = PrivatePostgres(root)
    pg.init()
    env = _env(pg.url)
    subprocess.run([sys.executable, "-m", "service.cli", "migrate"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = Cluster(root, pg)
    py = [sys.executable, "-m"]
    for i in range(2):
        port = free_port()
        c.api_urls.append(f"http://127.0.0.1:{port}")
        c.procs.append(Proc(f"api{i}", [*py, "service.cli", "serve", "--port", str(port)], env, root / f"api{i}.log"))
    for i in range(2):
        c.procs.append(Proc(f"worker{i}", [*py, "service.cli", "score-worker", "--processes", "1", "--batch", "8"],
                            {**env, **WORKER_ENV}, root / f"worker{i}.log"))
    urls = ",".join(c.api_urls)
    for i in range(2):
        c.procs.append(Proc(f"producer{i}", [*py, "bench.chaos", "producer", urls, str(root), f"p{i}"], env,
                            root / f"producer{i}.out"))
    for i in range(3):
        c.procs.append(Proc(f"consumer{i}", [*py, "bench.chaos", "consumer", urls, str(root), f"c{i}"], env,
                            root / f"consumer{i}.out"))
    return c


# -- producers and consumers (run as `python -m bench.chaos producer|consumer URLS ROOT NAME`) -----------
class Http:
    """Round-robin over the API processes; every call retried until it gets an answer (any status)."""

    def __init__(self, urls: str) -> None:
        import httpx

        self.urls = urls.split(",")
        self.http = httpx.Client(timeout=10)
        self.n = 0

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        while True:
            self.n += 1
            url = self.urls[self.n % len(self.urls)]
            try:
                r = self.http.request(method, url + path, **kwargs)
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            if r.status_code >= 500:
                time.sleep(0.2)
                continue
            return r


def group_body(gid: str) -> tuple[dict[str, Any], str]:
    """The group posted under ``gid`` (the same every time: a restarted producer re-posts it) and its kind."""
    rng = random.Random(gid)
    kind = rng.choices(["good", "tokenless", "erroring"], weights=[8, 1, 1])[0]
    answers = [rng.choice(["42", "41", "7"]) for _ in range(4)]
    trajectories = []
    for a in answers:
        t: dict[str, Any] = {"messages": [{"role": "assistant", "content": f"so \\boxed{{{a}}}"}],
                             "finish_reason": "stop"}
        if kind != "tokenless":
            n = rng.randrange(4, 12)
            t |= {"token_ids": [rng.randrange(1, 500) for _ in range(n)], "loss_mask": [0, 0] + [1] * (n - 2),
                  "logprobs": [0.0, 0.0] + [-0.5] * (n - 2)}
        trajectories.append(t)
    dataset = "chaos-err" if kind == "erroring" else "chaos"
    return {"id": gid, "prompt_id": f"cp-{rng.randrange(20)}-{dataset}", "policy_version": 0,
            "prompt": {"dataset": dataset, "messages": [{"role": "user", "content": "6*7?"}],
                       "reference": {"answer": "42"}},
            "sampling": {"temperature": 1.0, "max_tokens": 16}, "trajectories": trajectories}, kind


def read_log(path: Path) -> list[dict[str, Any]]:
    """A producer's log; a line cut short by a SIGKILL is skipped (its group is simply posted again)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def producer(urls: str, root: str, name: str) -> None:
    log = Path(root) / f"{name}.jsonl"
    done = {r["id"] for r in read_log(log)}
    http = Http(urls)
    i = 0
    while not (Path(root) / "stop").exists():
        gid = f"{name}-{i}"
        i += 1
        if gid in done:
            continue
        body, kind = group_body(gid)
        r = http.call("POST", "/v1/groups", json=body)
        n_tokens = sum(len(t.get("token_ids", [])) for t in body["trajectories"])
        with log.open("a") as f:
            f.write(json.dumps({"id": gid, "status": r.status_code, "kind": kind, "n_tokens": n_tokens,
                                "n_trajectories": len(body["trajectories"])}) + "\n")
        time.sleep(0.05)


def content_hash(trajectories: list[dict[str, Any]]) -> str:
    """What a trainer trains on, hashed: each trajectory's token ids and loss mask, in order."""
    import hashlib

    raw = json.dumps([[t.get("token_ids"), t.get("loss_mask")] for t in trajectories], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _trained_before(log: Path) -> set[str]:
    """Groups this consumer trained (its "checkpoint": the log is written before each ack)."""
    return {gid for r in read_log(log) for gid in r.get("trained", {})}


def consumer(urls: str, root: str, name: str) -> None:
    """A trainer-like consumer: lease, "train" (logged with each group's content hash: the log is its
    checkpoint), ack. Like trainer.delivery.Ledger, a group it already trained (its ack was refused, or it
    was killed before acking) that comes back to it is acked without training."""
    import uuid

    http = Http(urls)
    log = Path(root) / f"{name}.trained"
    done = _trained_before(log)
    while not (Path(root) / "consumers-stop").exists():
        body = {"trainer_id": name, "max_groups": 4, "lease_seconds": LEASE_SECONDS, "wait_seconds": 1.0,
                "request_id": uuid.uuid4().hex}
        r = http.call("POST", "/v1/batches/lease", json=body)
        if r.status_code != 200:
            continue
        batch = r.json()
        if any(t["token_ids"] is None for g in batch["groups"] for t in g["trajectories"]):
            with (Path(root) / f"{name}.poison").open("a") as f:  # curation should have kept it away
                f.write(batch["batch_id"] + "\n")
            http.call("POST", f"/v1/batches/{batch['batch_id']}/nack", json={"reason": "no tokens", "drop": True})
            continue
        fresh = {g["id"]: content_hash(g["trajectories"]) for g in batch["groups"] if g["id"] not in done}
        time.sleep(random.uniform(0.0, 0.3))  # "train"
        with log.open("a") as f:
            f.write(json.dumps({"batch": batch["batch_id"], "trained": fresh,
                                "skipped": [g["id"] for g in batch["groups"] if g["id"] in done]}) + "\n")
        done |= set(fresh)
        http.call("POST", f"/v1/batches/{batch['batch_id']}/ack")


# -- the run ---------------------------------------------------------------------------------------------
def setup_specs(c: Cluster) -> None:
    """A dataset whose spec always errors (an LLM judge whose endpoint is down): its groups are poison."""
    http = Http(",".join(c.api_urls))
    spec = {"name": "always-errors", "components": [{"name": "judge", "kind": "judge.llm", "outcome": True,
                                                     "params": {"endpoint": "down", "model": "m"}}]}
    assert http.call("POST", "/v1/reward-specs", json=spec).status_code in (200, 201)
    assert http.call("PUT", "/v1/datasets/chaos-err", json={"reward_spec": "always-errors"}).status_code == 200


def _wait_api(c: Cluster, timeout: float = 120) -> None:
    import httpx

    from service.client import health_client

    deadline = time.monotonic() + timeout
    with health_client(1) as http:
        for url in c.api_urls:
            while True:
                try:
                    if http.get(url + "/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} never became healthy")
                time.sleep(0.3)


def kill_cycles(c: Cluster, cycles: int, interval: float, pg_every: int, rng: random.Random) -> tuple[Counter, float]:
    """``cycles`` random kills, then the last one: an API process and a score worker SIGKILLed together
    while the producers post (the worker's claims die with it). -> (kills by kind, monotonic time of the
    last kill)."""
    killed: Counter = Counter()
    for cycle in range(1, cycles + 1):
        time.sleep(interval * rng.uniform(0.5, 1.5))
        if pg_every and cycle % pg_every == 0:
            c.pg.kill()
            killed["postgres"] += 1
            continue
        p = rng.choice(c.procs)
        p.kill()
        p.start()
        killed[p.name.rstrip("0123456789")] += 1
    time.sleep(interval * rng.uniform(0.5, 1.5))
    last = [rng.choice([p for p in c.procs if p.name.startswith(kind)]) for kind in ("api", "worker")]
    for p in last:
        p.kill()
    t_last = time.monotonic()
    for p in last:
        p.start()
        killed[p.name.rstrip("0123456789")] += 1
    return killed, t_last


def _statuses(url: str) -> dict[str, str] | None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return dict(conn.execute("SELECT id, status FROM groups").fetchall())
    except psycopg.Error:
        return None


def settle(c: Cluster, t_last: float, budget: float = SETTLE_S) -> dict[str, Any]:
    """Stop producing; poll until every group the API acknowledged (the producers' logs) is scored and
    curated (``SETTLED``), at most ``budget`` seconds after the last kill. -> seconds after the last kill
    it took (None: not within the budget) and the groups still unsettled then, as "id: status"."""
    (c.root / "stop").touch()
    pending: dict[str, str] = {}
    while True:
        producers_done = all(p.popen.poll() is not None for p in c.procs if p.name.startswith("producer"))
        acked = [r["id"] for name in ("p0", "p1") for r in read_log(c.root / f"{name}.jsonl")
                 if r["status"] in (200, 201)]
        statuses = _statuses(c.pg.url)
        if statuses is not None:
            pending = {g: statuses.get(g, "absent") for g in acked if statuses.get(g) not in SETTLED}
            if not pending and producers_done:
                return {"settle_s": round(time.monotonic() - t_last, 1), "unsettled": []}
        if time.monotonic() - t_last > budget:
            return {"settle_s": None, "unsettled": [f"{g}: {s}" for g, s in sorted(pending.items())]}
        time.sleep(1.0)


def drain(c: Cluster, url: str, timeout: float) -> float:
    """Stop producing, let everything finish; -> seconds it took until no group was in flight."""
    (c.root / "stop").touch()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        time.sleep(1.0)
        if _count_in_flight(url) == 0 and all(p.popen.poll() is not None for p in c.procs if "producer" in p.name):
            break
    return time.monotonic() - t0


def _count_in_flight(url: str) -> int:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute(f"SELECT count(*) FROM groups WHERE status <> ALL(ARRAY{list(FINAL)})").fetchone()[0]
    except psycopg.Error:
        return -1


# -- the check -------------------------------------------------------------------------------------------
BAD_ENDS = ("reward_error", "curation_error", "untrainable", "stale")  # a good group must not end so


def _good_end(status: str, reason: str | None) -> bool:
    """A good group ends consumed, or dropped by a curation rule on its rewards (zero variance, ...)."""
    return status == "consumed" or (status == "dropped" and reason not in BAD_ENDS)


def _trained(root: Path) -> tuple[Counter, Counter, dict[str, set[str]]]:
    """From the consumers' logs: times each group was trained in all, by any one consumer at most, and the
    content hashes each was trained with."""
    total: Counter = Counter()
    worst: Counter = Counter()
    hashes: dict[str, set[str]] = {}
    for path in root.glob("*.trained"):
        mine: Counter = Counter()
        for rec in read_log(path):
            for gid, h in rec.get("trained", {}).items():
                mine[gid] += 1
                hashes.setdefault(gid, set()).add(h)
        total.update(mine)
        worst = worst | mine
    return total, worst, hashes


def check(c: Cluster) -> dict[str, Any]:
    """Compare what the API acknowledged (producers' logs) with what the database holds and what the
    consumers trained (their logs)."""
    import psycopg

    sent = {r["id"]: r for name in ("p0", "p1") for r in read_log(c.root / f"{name}.jsonl")}
    acked = {gid: r for gid, r in sent.items() if r["status"] in (200, 201)}
    with psycopg.connect(c.pg.url) as conn:
        rows = {gid: (status, reason, n, tok) for gid, status, reason, n, tok in conn.execute(
            "SELECT g.id, g.status, g.drop_reason, count(t.idx), g.n_tokens FROM groups g"
            " LEFT JOIN trajectories t ON t.group_pk = g.pk GROUP BY g.pk")}
        # the same content stored twice, under any ids (groups.id is UNIQUE: this looks at content)
        dup_content = conn.execute(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM (SELECT g.pk, md5(string_agg("
            "coalesce(encode(t.token_ids, 'hex'), '-') || ':' || t.messages::text, '|' ORDER BY t.idx)) AS h"
            " FROM groups g JOIN trajectories t ON t.group_pk = g.pk GROUP BY g.pk"
            " HAVING bool_and(t.token_ids IS NOT NULL)) x GROUP BY h) y").fetchone()[0]  # token-less: not unique
        per_group = Counter(pk for (pks,) in conn.execute("SELECT group_pks FROM leases WHERE status = 'acked'")
                            for pk in pks)
    total, by_one, hashes = _trained(c.root)
    expect = {gid: content_hash(group_body(gid)[0]["trajectories"]) for gid in hashes}
    lost = [g for g, r in acked.items() if g not in rows or rows[g][2] != r["n_trajectories"]
            or rows[g][3] != r["n_tokens"]]
    good_bad_end = [g for g, r in acked.items() if r["kind"] == "good" and g in rows and rows[g][0] in FINAL
                    and not _good_end(rows[g][0], rows[g][1])]
    poison: Counter = Counter()
    for gid, r in acked.items():
        if r["kind"] != "good" and gid in rows:
            poison[(r["kind"], rows[gid][0], rows[gid][1])] += 1
    poison_leased = sum(len(p.read_text().split()) for p in c.root.glob("*.poison"))
    return {
        "acknowledged": len(acked),
        "lost": len(lost) + len(good_bad_end),
        "lost_examples": (lost + good_bad_end)[:5],
        "good_not_consumed": len(good_bad_end),
        "duplicated": int(dup_content),
        "stuck": sum(1 for v in rows.values() if v[0] not in FINAL),
        "consumed_twice": sum(1 for n in per_group.values() if n > 1),
        "trained_twice_by_one": sum(1 for n in by_one.values() if n > 1),
        "trained_twice": sum(1 for n in total.values() if n > 1),
        "trained_wrong_content": sum(1 for g, hs in hashes.items() if hs != {expect[g]}),
        "consumed_untrained": sum(1 for g, v in rows.items() if v[0] == "consumed" and g not in total)
        if list(c.root.glob("*.trained")) else 0,
        "consumed": sum(1 for v in rows.values() if v[0] == "consumed"),
        "statuses": dict(Counter(v[0] for v in rows.values())),
        "poison": {f"{k[0]} -> {k[1]} ({k[2]})": n for k, n in sorted(poison.items())},
        "poison_batches_reaching_consumers": poison_leased,
    }


def run(cycles: int, interval: float, pg_every: int, drain_s: float, seed: int, keep: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="grpo-chaos-"))
    rng = random.Random(seed)
    c = build(root)
    t0 = time.monotonic()
    try:
        for p in c.procs:
            if not p.name.startswith(("producer", "consumer")):
                p.start()
        _wait_api(c)
        setup_specs(c)
        for p in c.procs:
            if p.name.startswith(("producer", "consumer")):
                p.start()
        killed, t_last = kill_cycles(c, cycles, interval, pg_every, rng)
        chaos_s = time.monotonic() - t0
        settled = settle(c, t_last)
        drained_s = drain(c, c.pg.url, drain_s)
        result = {"cycles": cycles, "killed": dict(killed), "chaos_s": round(chaos_s, 1),
                  "drain_s": round(drained_s, 1), **settled, **check(c)}
    finally:
        (root / "consumers-stop").touch()
        for p in c.procs:
            p.stop()
        c.pg.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    result["workdir"] = str(root) if keep else None
    return result


def print_table(r: dict[str, Any]) -> None:
    rows = [("kill cycles", r["cycles"]), ("processes killed", ", ".join(f"{k} {v}" for k, v in sorted(r["killed"].items()))),
            ("groups acknowledged by the API", r["acknowledged"]), ("lost", r["lost"]),
            ("  of which good groups not consumed", r["good_not_consumed"]), ("duplicated", r["duplicated"]),
            ("stuck after drain", r["stuck"]), ("consumed twice (acked leases)", r["consumed_twice"]),
            ("trained twice by one consumer", r["trained_twice_by_one"]),
            ("trained twice in all (crash outlasted the lease)", r["trained_twice"]),
            ("trained with other content", r["trained_wrong_content"]),
            ("consumed but never trained", r["consumed_untrained"]), ("consumed", r["consumed"]),
            ("final statuses", r["statuses"]), ("poison batches reaching consumers", r["poison_batches_reaching_consumers"]),
            ("chaos / drain seconds", f"{r['chaos_s']} / {r['drain_s']}"),
            (f"all acknowledged scored + curated after the last kill (<= {SETTLE_S:g} s)",
             f"{r['settle_s']} s" if r["settle_s"] is not None else f"NO: {len(r['unsettled'])} not"),
            *((("  unsettled", ", ".join(r["unsettled"][:10])),) if r["unsettled"] else ())]
    rows += [(f"poison {k}", v) for k, v in r["poison"].items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def ok(r: dict[str, Any]) -> bool:
    gated = ("lost", "duplicated", "stuck", "consumed_twice", "trained_twice_by_one", "trained_wrong_content",
             "consumed_untrained", "poison_batches_reaching_consumers")
    return all(r[k] == 0 for k in gated) and not r["unsettled"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("producer", "consumer"):
        (producer if argv[0] == "producer" else consumer)(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--interval", type=float, default=3.0, help="mean seconds between kills")
    ap.add_argument("--pg-every", type=int, default=7, help="kill PostgreSQL every N-th cycle (0: never)")
    ap.add_argument("--drain", type=float, default=90.0, help="max seconds to let everything finish")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, cluster)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.cycles, args.interval, args.pg_every, args.drain, args.seed, args.keep)
    print(json.dumps(r, indent=1) if args.json else "", end="")
    print_table(r)
    return 0 if ok(r) else 1


if __name__ == "__main__":
    raise SystemExit(main())
