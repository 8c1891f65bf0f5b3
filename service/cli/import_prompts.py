"""``grpo-curator import prompts FILE --format verl|jsonl``: prompts in, streaming and idempotent.

grpo-curator import prompts train.parquet --format verl          # verl's RL Parquet
grpo-curator import prompts prompts.jsonl --format jsonl         # POST /v1/prompts items, one a line

Rows are validated here (rejections counted by field, a few shown) and posted in batches of 1000 to
``POST /v1/prompts``. Importing the same file again changes nothing: a prompt's id is its own (jsonl) or
a hash of its content (verl). Prints a JSON summary ``{taken, rejected, reasons, examples}``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from pydantic import ValidationError

from service.cli.connection import add_client_options, api_key, http_client, redact, service_url, unreachable
from service.cli.errors import ServiceAnswered

if TYPE_CHECKING:  # the service's schemas (FastAPI, numpy, every reward component): imported once rows are read
    from service.export.schemas import ImportSummary
    from service.ingest.schemas import PromptUpsert

BATCH = 1000
EXAMPLES = 5


def verl_prompt(row: dict[str, Any]) -> dict[str, Any]:
    """A verl RL Parquet row -> a prompt upsert (``dataset`` = data_source, ``reference.answer`` = the
    ground truth, ``metadata`` = extra_info plus ``ability``); the id hashes the content, so importing the
    same file twice changes nothing."""
    rm = row.get("reward_model") or {}
    # a Parquet struct always has its children: a missing label arrives as None, and is missing all the same
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise ValueError("reward_model.ground_truth: missing")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise ValueError("extra_info: expected a mapping")
    metadata = {**extra, **({"ability": row["ability"]} if row.get("ability") is not None else {})}
    content = [row.get("data_source"), row.get("prompt"), rm["ground_truth"]]
    digest = hashlib.sha256(orjson.dumps(content, default=str)).hexdigest()[:24]
    reference = code_reference(rm["ground_truth"]) if row.get("ability") == "code" else {"answer": rm["ground_truth"]}
    return {"id": f"verl-{digest}", "dataset": row.get("data_source"), "messages": row.get("prompt"),
            "reference": reference, "metadata": metadata}


def code_reference(truth: Any) -> dict[str, Any]:
    """A verl code row's ground truth (``ability == "code"``) -> the reference ``verifier.code`` runs: JSON
    ``{"inputs": [...], "outputs": [...]}`` (stdin / stdout cases, verl's code datasets) -> ``io``; a JSON
    list of assert lines -> ``tests`` (joined); a JSON string, or text that is not JSON -> ``tests`` (Python
    source). Anything else is a ValueError naming ``reward_model.ground_truth``."""
    where = "reward_model.ground_truth"
    value = truth
    if isinstance(truth, str):
        try:
            value = orjson.loads(truth)
        except orjson.JSONDecodeError:
            return {"tests": truth}  # Python source
    if isinstance(value, str):
        return {"tests": value}
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return {"tests": "\n".join(value) + "\n"}
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        if value.get("fn_name"):
            raise ValueError(f"{where}: call-based cases (fn_name) are not supported; give stdin / stdout "
                             "cases or Python tests")
        inputs, outputs = value["inputs"], value["outputs"]
        if not (isinstance(inputs, list) and isinstance(outputs, list) and inputs and len(inputs) == len(outputs)
                and all(isinstance(x, str) for x in inputs + outputs)):
            raise ValueError(f"{where}: inputs / outputs must be equally long non-empty lists of strings")
        return {"io": [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]}
    if isinstance(truth, str) and not isinstance(value, dict | list):
        return {"tests": truth}  # source that happens to be a JSON scalar ("1")
    raise ValueError(f"{where}: a code row needs Python tests (text, or a JSON list of asserts) or JSON "
                     '{"inputs": [...], "outputs": [...]}')


def _verl_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        yield from batch.to_pylist()


def _jsonl_rows(path: Path) -> Iterator[Any]:
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    yield ValueError(f"line: invalid JSON ({exc})")


class _Tally:
    def __init__(self) -> None:
        self.taken, self.reasons, self.examples = 0, Counter[str](), list[str]()

    def reject(self, row_no: int, reason: str) -> None:
        field = reason.split(":", 1)[0]
        self.reasons[field] += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(f"row {row_no}: {reason}")

    def summary(self) -> ImportSummary:
        from service.export.schemas import ImportSummary

        return ImportSummary(taken=self.taken, rejected=sum(self.reasons.values()), reasons=dict(self.reasons),
                             examples=self.examples)


def _validated(rows: Iterator[Any], fmt: str, tally: _Tally) -> Iterator[PromptUpsert]:
    from service.api.validation import format_errors
    from service.ingest.schemas import PromptUpsert

    for row_no, row in enumerate(rows):
        try:
            if isinstance(row, Exception):
                raise row
            raw = verl_prompt(row) if fmt == "verl" else row
            yield PromptUpsert.model_validate(raw)
        except ValidationError as exc:
            tally.reject(row_no, format_errors(exc.errors(include_url=False))[0])
        except ValueError as exc:
            tally.reject(row_no, str(exc))


def import_prompts(client: httpx.Client, path: Path, fmt: str) -> ImportSummary:
    """Validate each row locally (rejections counted by field), post the rest in batches."""
    tally = _Tally()
    rows = _verl_rows(path) if fmt == "verl" else _jsonl_rows(path)
    batch: dict[str, PromptUpsert] = {}
    for prompt in _validated(rows, fmt, tally):
        tally.taken += 1
        batch[prompt.id] = prompt  # the same id twice in one batch: the last row wins (as a second upsert would)
        if len(batch) >= BATCH:
            _post(client, batch)
    if batch:
        _post(client, batch)
    return tally.summary()


def _post(client: httpx.Client, batch: dict[str, PromptUpsert]) -> None:
    body = b'{"prompts":[' + b",".join(p.model_dump_json(exclude_none=True).encode() for p in batch.values()) + b"]}"
    r = client.post("/v1/prompts", content=body, headers={"content-type": "application/json"})
    if r.status_code != 200:
        raise ServiceAnswered.of(r)
    batch.clear()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grpo-curator import", description="import prompts (verl Parquet or JSONL)")
    ap.add_argument("what", choices=["prompts"])
    ap.add_argument("file", type=Path)
    ap.add_argument("--format", choices=["verl", "jsonl"], required=True)
    add_client_options(ap)
    args = ap.parse_args(argv)
    if not args.file.is_file():
        print(f"error: {args.file}: no such file", file=sys.stderr)
        return 1
    url = service_url(args)
    try:
        with http_client(url, api_key(args)) as client:
            summary = import_prompts(client, args.file, args.format)
    except httpx.TransportError as exc:  # unreachable / unknown host: "[Errno -2] ..." alone names nothing
        print(f"error: {unreachable(url, exc)}", file=sys.stderr)
        return 1
    except (RuntimeError, httpx.HTTPError, OSError) as exc:
        print(redact(f"error: {exc}", args), file=sys.stderr)
        return 1
    print(summary.model_dump_json(indent=2))
    return 0 if summary.taken or not summary.rejected else 2
