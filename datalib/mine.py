"""Preference mining from feedback logs: denoise raters, pair ratings, filter, dedupe, scrub PII.

Thumbs up/down logs are the cheapest preference data and the noisiest: some users up-vote everything, some
distrust everything, some click at random. The seed's rule is to keep only high-confidence pairs: the same user
rating the same kind of problem both ways. :func:`mine_pairs` implements it in vectorised steps (numpy/pandas
group-bys, no Python loop per event), each step counted in the report:

1. **Validate.** Rows with a missing field, a rating outside {up, down} or an unparsable ts are dropped and
   counted (the ``validate`` stage quarantines them with reasons; mining never fails on them).
2. **Scrub PII** (:mod:`datalib.pii`) from prompts, responses, user ids and categories *first*: nothing mined,
   reported or returned can carry a raw e-mail, key or host name. Prompts and responses are then keyed by their
   scrubbed, whitespace-normalised text (prompts also case-folded), so PII or spacing never splits a cluster.
3. **Double clicks.** A rating that repeats the same user's rating of the same response to the same prompt
   within ``double_click_window_s`` seconds is dropped.
4. **Denoise raters.** The miner cannot see true quality; it uses the *other users'* ratings of the same
   response as an observable proxy. For every rating, the leave-one-out consensus is the up-rate of that
   response among the other (retained) users; a response with ≥ ``min_consensus_raters`` other ratings is
   consensus-good when that up-rate is above ``consensus_threshold`` and consensus-bad when below. Per user,
   the 2×2 table (own rating up/down × consensus good/bad) gets a one-sided Fisher exact test of positive
   association (``scipy.stats.hypergeom``; H0: the user's ratings are independent of quality). A user is
   kept when ``p < alpha`` with at least ``min_ratings_per_user`` tested ratings. Always-up and always-down
   users have p = 1 (a constant margin carries no information) and random clickers have uniform p, so both
   are dropped; careful raters agree with the consensus and are kept. The consensus is recomputed from the
   kept users only, ``consensus_rounds`` times (indiscriminate raters no longer pollute it).
5. **Pair.** Within a kept user, an up-rated and a down-rated response to the same prompt (hence the same
   category) form a pair (chosen = up, rejected = down). DPO needs one prompt per pair, which is why the
   category rule of the seed is applied at prompt level (a user who regenerates an answer and rates both).
   At most ``max_pairs_per_user_category`` up and down ratings per (user, prompt) enter the cross product.
6. **Filter.** Pairs are dropped when chosen and rejected are the same response (the user contradicted
   themselves); when the other kept users' consensus contradicts them (both responses have one, and the chosen
   one's up-rate is not ahead by ``consensus_margin``: a careful rater's slip); or when the two are too similar
   (:func:`similarity` ≥ ``similarity_threshold``; near-identical pairs drive likelihood displacement in DPO,
   Razin et al. 2024, "Unintentional Unalignment").
7. **Dedupe.** Responses to the same prompt whose similarity is ≥ ``dedupe_threshold`` form one cluster; one
   pair is kept per (prompt, chosen cluster, rejected cluster), the earliest.
8. **Cap.** At most ``max_pairs_per_user_category`` pairs per (user, category), a seeded sample, so that one
   prolific user cannot dominate.
9. **Human pairs** (optional, ``prompt, chosen, rejected, annotator, dimension``): validated, scrubbed,
   filtered and deduplicated against the log pairs, tagged ``source="human"``, ``category="human:<dimension>"``
   and ``user_id=<annotator>``.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from scipy.stats import hypergeom

from datalib.pii import PLACEHOLDERS, scrub_series
from datalib.schema import EVENT_FIELDS, PAIR_FIELDS
from tasks.config import MineConfig

EVENT_COLUMNS = EVENT_FIELDS
HUMAN_COLUMNS = PAIR_FIELDS
PAIR_COLUMNS = ("prompt", "chosen", "rejected", "source", "category", "user_id", "chosen_event_id", "rejected_event_id")


# ---------------------------------------------------------------------------------------------------- text keys

_TOKEN = re.compile(r"\w+|[^\w\s]")
_REASONS = ("kept", "constant", "too_few_ratings", "uninformative")


def normalise(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped (the identity used for keys and similarity)."""
    return " ".join(text.split())


def similarity(a: str, b: str) -> float:
    """Token-sequence similarity of two texts in [0, 1]: ``2·M / (|a| + |b|)`` over the word and punctuation
    tokens of the texts, where M counts the tokens of the common prefix, the common suffix and difflib's
    matching blocks between the two differing middles (equal to difflib's ratio in practice, and fast for
    near-identical texts, the case that matters). 1.0 for identical token lists."""
    return _token_ratio(_TOKEN.findall(a), _TOKEN.findall(b))


def _token_ratio(ta: list[str], tb: list[str]) -> float:
    la, lb = len(ta), len(tb)
    if la + lb == 0:
        return 1.0
    prefix = 0
    while prefix < min(la, lb) and ta[prefix] == tb[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(la, lb) - prefix and ta[la - 1 - suffix] == tb[lb - 1 - suffix]:
        suffix += 1
    mid_a, mid_b = ta[prefix : la - suffix], tb[prefix : lb - suffix]
    matched = prefix + suffix
    if mid_a and mid_b:
        blocks = difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_matching_blocks()
        matched += sum(block.size for block in blocks)
    return 2.0 * matched / (la + lb)


class _Similarity:
    """:func:`similarity` between texts of an array, by index, with per-text token caches and cheap upper
    bounds (length ratio, then bag-of-tokens overlap) that skip the full ratio when already below a floor."""

    def __init__(self, texts: np.ndarray):
        self.texts = texts
        self._tokens: dict[int, list[str]] = {}
        self._bags: dict[int, Counter] = {}

    def tokens(self, i: int) -> list[str]:
        if i not in self._tokens:
            self._tokens[i] = _TOKEN.findall(self.texts[i])
            self._bags[i] = Counter(self._tokens[i])
        return self._tokens[i]

    def bound(self, a: int, b: int, floor: float = 1.0) -> float:
        """An upper bound of the similarity: the length ratio when already below ``floor``, else the
        bag-of-tokens overlap ``2·|A ∩ B| / (|A| + |B|)``."""
        la, lb = len(self.tokens(a)), len(self.tokens(b))
        if la + lb == 0:
            return 1.0
        by_length = 2.0 * min(la, lb) / (la + lb)
        if by_length < floor:
            return by_length
        return 2.0 * sum((self._bags[a] & self._bags[b]).values()) / (la + lb)

    def many(self, pairs: list[tuple[int, int]], floor: float) -> dict[tuple[int, int], float]:
        """Similarity per distinct (a, b); values below ``floor`` may be upper bounds instead of exact."""
        out: dict[tuple[int, int], float] = {}
        for a, b in dict.fromkeys(pairs):
            bound = self.bound(a, b, floor)
            out[(a, b)] = bound if bound < floor else _token_ratio(self.tokens(a), self.tokens(b))
        return out


# ---------------------------------------------------------------------------------------------------- the log


@dataclass
class _Log:
    """Validated events as integer codes (no text is copied per row) plus the scrubbed texts per code.

    frame columns: ``t`` (seconds since the epoch), ``u`` (user), ``pk`` (prompt key: category + normalised,
    case-folded scrubbed prompt), ``rk`` (response key: normalised scrubbed response), ``pc``/``rc`` (the raw
    prompt/response text), ``cc`` (category), ``row`` (position in the input: tie-breaker, index of
    ``event_ids``), ``y`` (1 = up).
    """

    frame: pd.DataFrame
    event_ids: np.ndarray
    prompts: np.ndarray
    responses: np.ndarray
    response_norm: np.ndarray
    users: np.ndarray
    categories: np.ndarray
    invalid: dict[str, int]


def _nonblank(col: pd.Series) -> np.ndarray:
    """Per row: the value is a str with a non-whitespace character (one RE2 pass when the column is all
    strings/nulls, a Python pass otherwise)."""
    try:
        arr = pa.array(col.to_numpy(dtype=object), type=pa.large_string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return np.fromiter((isinstance(v, str) and v.strip() != "" for v in col), dtype=bool, count=len(col))
    hit = pc.match_substring_regex(arr, r"\S")
    return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)


def _scrubbed_codes(col: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per selected row, scrubbed text per code): each distinct value of ``col[rows]`` is scrubbed once."""
    codes, uniques = pd.factorize(col.to_numpy(dtype=object)[rows])
    clean = scrub_series(pd.Series(np.asarray(uniques, dtype=object), dtype=object)).to_numpy(dtype=object)
    return codes, clean


def _read_log(events: pd.DataFrame) -> _Log:
    """Validate (counting dropped rows by reason), scrub and key the events; the texts are handled once per
    distinct value."""
    missing = [c for c in EVENT_COLUMNS if c not in events.columns]
    if missing:
        raise ValueError(f"mine_pairs: events lack the columns {missing} (schema: data/README.md)")
    bad = np.zeros(len(events), dtype=bool)
    invalid: dict[str, int] = {}
    for col in EVENT_COLUMNS:
        ok = _nonblank(events[col])
        invalid[f"missing_{col}"] = int((~ok & ~bad).sum())
        bad |= ~ok
    rating = events["rating"].to_numpy(dtype=object)
    rating_ok = np.isin(rating, ["up", "down"])
    invalid["invalid_rating"] = int((~rating_ok & ~bad).sum())
    bad |= ~rating_ok
    ts = pd.Series(np.where(bad, None, events["ts"].to_numpy(dtype=object)), dtype=object)
    parsed = pd.to_datetime(ts, utc=True, format="ISO8601", errors="coerce")
    seconds = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
    invalid["invalid_ts"] = int((np.isnan(seconds) & ~bad).sum())
    bad |= np.isnan(seconds)
    rows = np.flatnonzero(~bad)

    pc_, prompts = _scrubbed_codes(events["prompt"], rows)
    rc, responses = _scrubbed_codes(events["response"], rows)
    uc, users = _scrubbed_codes(events["user_id"], rows)
    cc, categories = _scrubbed_codes(events["category"], rows)
    prompt_key = pd.factorize(np.array([normalise(p).casefold() for p in prompts], dtype=object))[0]
    response_key, response_norm = pd.factorize(np.array([normalise(r) for r in responses], dtype=object))
    frame = pd.DataFrame(
        {
            "t": seconds[rows],
            "u": uc,
            "pk": pd.factorize(cc.astype(np.int64) * (len(prompts) + 1) + prompt_key[pc_])[0],
            "rk": response_key[rc],
            "pc": pc_,
            "rc": rc,
            "cc": cc,
            "row": rows,
            "y": (rating[rows] == "up").astype(np.int8),
        }
    )
    return _Log(
        frame,
        events["event_id"].to_numpy(dtype=object),
        prompts,
        responses,
        np.asarray(response_norm, dtype=object),
        users,
        categories,
        {k: v for k, v in invalid.items() if v},
    )


def _drop_double_clicks(ev: pd.DataFrame, window_s: float) -> tuple[pd.DataFrame, int]:
    """Drop a rating that repeats the previous rating of the same (user, prompt, response, rating) within
    ``window_s`` seconds."""
    cols = [ev[c].to_numpy() for c in ("row", "t", "y", "rk", "pk", "u")]
    order = np.lexsort(cols)
    same = np.zeros(len(ev), dtype=bool)
    if len(ev) > 1:
        same[1:] = True
        for v in cols[2:]:
            v = v[order]
            same[1:] &= v[1:] == v[:-1]
        same[1:] &= np.diff(cols[1][order]) <= window_s
    keep = np.ones(len(ev), dtype=bool)
    keep[order[same]] = False
    return ev.loc[keep], int(same.sum())


# ---------------------------------------------------------------------------------------------------- denoising


def consensus(ev: pd.DataFrame, include: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Leave-one-out consensus per event: ``(up_rate, n)`` of the *other* included users' ratings of the same
    response key (the event's own user is left out entirely, all their ratings of it). ``include[u]`` says
    whether user u's ratings count. Shapes: (n_events,); up_rate is NaN where n = 0."""
    u, rk, y = ev["u"].to_numpy(), ev["rk"].to_numpy(), ev["y"].to_numpy().astype(np.float64)
    n_resp = int(rk.max()) + 1 if len(rk) else 0
    ur = pd.factorize(u.astype(np.int64) * max(n_resp, 1) + rk)[0]
    m = include[u].astype(np.float64)
    r_up, r_n = np.bincount(rk, y * m, n_resp), np.bincount(rk, m, n_resp)
    own_up, own_n = np.bincount(ur, y * m)[ur], np.bincount(ur, m)[ur]
    others_n = r_n[rk] - own_n
    with np.errstate(invalid="ignore", divide="ignore"):
        up_rate = (r_up[rk] - own_up) / others_n
    return up_rate, others_n


def _user_tests(ev: pd.DataFrame, n_users: int, cfg: MineConfig) -> pd.DataFrame:
    """Per user code: ratings, tested ratings, the 2×2 table a/b/c/d, p-value, decision and reason."""
    u, up = ev["u"].to_numpy(), ev["y"].to_numpy() > 0
    n_ratings = np.bincount(u, minlength=n_users)
    ups = np.bincount(u, weights=up, minlength=n_users)
    include = np.ones(n_users, dtype=bool)
    for _ in range(cfg.consensus_rounds):
        cons, others = consensus(ev, include)
        known = others >= cfg.min_consensus_raters
        good = known & (cons > cfg.consensus_threshold)
        bad = known & (cons < cfg.consensus_threshold)
        a = np.bincount(u, up & good, n_users).astype(np.int64)
        b = np.bincount(u, up & bad, n_users).astype(np.int64)
        c = np.bincount(u, ~up & good, n_users).astype(np.int64)
        d = np.bincount(u, ~up & bad, n_users).astype(np.int64)
        n = a + b + c + d
        # One-sided Fisher exact test of positive association: P(X ≥ a), X ~ Hypergeom(n, a + c good, a + b up).
        p = np.ones(n_users)
        t = n > 0
        p[t] = hypergeom.sf(a[t] - 1, n[t], a[t] + c[t], a[t] + b[t])
        include = (n >= cfg.min_ratings_per_user) & (p < cfg.alpha)
    constant = (n_ratings > 0) & ((ups == 0) | (ups == n_ratings))
    reason = np.where(
        include,
        "kept",
        np.where(constant, "constant", np.where(n < cfg.min_ratings_per_user, "too_few_ratings", "uninformative")),
    )
    return pd.DataFrame(
        {
            "n_ratings": n_ratings,
            "up_rate": ups / np.maximum(n_ratings, 1),
            "n_tested": n,
            "a": a,
            "b": b,
            "c": c,
            "d": d,
            "p_value": p,
            "kept": include,
            "reason": reason,
        }
    )


def rate_users(events: pd.DataFrame, cfg: MineConfig | None = None) -> pd.DataFrame:
    """The denoising decision per user (step 4 of the module docstring), after validation and double clicks.

    Returns:
        one row per user with a valid event, indexed by the raw ``user_id`` (a diagnostic for whoever holds the
        raw log; the stage never writes it), with ``n_ratings, up_rate, n_tested, a, b, c, d, p_value, kept,
        reason``: a/b/c/d count the user's ratings up&good, up&bad, down&good, down&bad against the
        leave-one-out consensus; reason is ``kept``, ``constant`` (all ratings equal), ``too_few_ratings`` or
        ``uninformative`` (p ≥ alpha).
    """
    cfg = cfg or MineConfig()
    log = _read_log(events)
    ev, _ = _drop_double_clicks(log.frame, cfg.double_click_window_s)
    stats = _user_tests(ev, len(log.users), cfg)
    first = ev.drop_duplicates("u").sort_values("u")
    stats = stats.iloc[first["u"].to_numpy()]
    stats.index = pd.Index(events["user_id"].to_numpy(dtype=object)[first["row"].to_numpy()], name="user_id")
    return stats


# ---------------------------------------------------------------------------------------------------- pairing


def _cross(ev: pd.DataFrame, cap: int) -> pd.DataFrame:
    """All (up, down) rating pairs of one user on one prompt key, at most ``cap`` of each side (earliest)."""
    s = ev.sort_values(["u", "pk", "y", "t", "row"], kind="stable")
    s = s.loc[(s.groupby(["u", "pk", "y"], sort=False).cumcount() < cap).to_numpy()]
    cols = ["u", "pk", "rk", "rc", "t", "row", "cons"]
    ups = s.loc[s["y"].to_numpy() == 1, cols + ["pc", "cc"]]
    downs = s.loc[s["y"].to_numpy() == 0, cols]
    return ups.merge(downs, on=["u", "pk"], suffixes=("_c", "_r"))


def _clusters(cand: pd.DataFrame, sim: _Similarity, threshold: float) -> dict[tuple[int, int], int]:
    """Greedy clustering of the responses of each prompt key: a response (in key order) joins the first
    cluster whose representative has similarity ≥ threshold, else starts one. Returns (pk, rk) → cluster rk."""
    members = pd.concat(
        [cand[["pk", "rk_c"]].set_axis(["pk", "rk"], axis=1), cand[["pk", "rk_r"]].set_axis(["pk", "rk"], axis=1)]
    ).drop_duplicates()
    members = members.sort_values(["pk", "rk"])
    cluster: dict[tuple[int, int], int] = {}
    pks, rks = members["pk"].to_numpy().tolist(), members["rk"].to_numpy().tolist()
    reps: list[int] = []
    for i, (pk, rk) in enumerate(zip(pks, rks, strict=True)):
        if i == 0 or pk != pks[i - 1]:
            reps = []
        home = rk
        if threshold < 1.0:
            for rep in reps:
                if sim.many([(rk, rep)], threshold)[(rk, rep)] >= threshold:
                    home = rep
                    break
        if home == rk:
            reps.append(rk)
        cluster[(pk, rk)] = home
    return cluster


def _seeded_rank(keys: pd.Series, seed: int) -> np.ndarray:
    return pd.util.hash_pandas_object(keys, index=False, hash_key=f"{seed % 10**16:016d}").to_numpy()


def mine_pairs(
    events: pd.DataFrame, cfg: MineConfig | None = None, human_pairs: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Mine high-confidence preference pairs from feedback events (the steps of the module docstring).

    Args:
        events: feedback logs in the schema of data/README.md (``event_id, ts, user_id, session_id, prompt,
            response, rating, category, model_version``; ts ISO 8601). Extra columns are ignored.
        cfg: the ``mine`` configuration (defaults: :class:`MineConfig`).
        human_pairs: optional human-annotated pairs (``prompt, chosen, rejected, annotator, dimension``).

    Returns:
        ``(pairs, report)``. ``pairs`` has the columns :data:`PAIR_COLUMNS` (every text and id PII-scrubbed;
        ``source`` is ``logs`` or ``human``; event ids are None for human pairs), sorted by source, category,
        user and event ids. ``report`` is a JSON-serialisable dict: rows dropped by validation, double clicks,
        users per denoising outcome, log pairs removed per rule, human pairs per rule, pairs per source and per
        category, placeholder counts in the pairs, and the configuration.

    Raises:
        ValueError: a required column is missing.
    """
    cfg = cfg or MineConfig()
    log = _read_log(events)
    ev, n_double = _drop_double_clicks(log.frame, cfg.double_click_window_s)
    report: dict[str, Any] = {
        "events_in": int(len(events)),
        "invalid_rows": log.invalid,
        "double_clicks_dropped": n_double,
        "events_used": int(len(ev)),
    }
    users = _user_tests(ev, len(log.users), cfg)
    active = users["n_ratings"].to_numpy() > 0
    reasons = Counter(users.loc[active, "reason"].tolist())
    report["users"] = {"total": int(active.sum())} | {k: int(reasons.get(k, 0)) for k in _REASONS}
    kept_users = users["kept"].to_numpy(dtype=bool)
    cons, others = consensus(ev, kept_users)
    ev = ev.assign(cons=np.where(others >= cfg.min_consensus_raters, cons, np.nan))
    ev = ev.loc[kept_users[ev["u"].to_numpy()]]
    report["events_from_kept_users"] = int(len(ev))

    rules: dict[str, int] = {}
    cand = _cross(ev, cfg.max_pairs_per_user_category)
    rules["candidates"] = int(len(cand))
    same = cand["rk_c"].to_numpy() == cand["rk_r"].to_numpy()
    rules["same_response_both_ways"] = int(same.sum())
    cand = cand.loc[~same]
    # The other kept users' consensus contradicts the pair: chosen not ahead of rejected by the margin.
    margin = cand["cons_c"].to_numpy() - cand["cons_r"].to_numpy()
    contradicts = ~np.isnan(margin) & (margin < cfg.consensus_margin)
    rules["contradicts_consensus"] = int(contradicts.sum())
    cand = cand.loc[~contradicts]

    sim = _Similarity(log.response_norm)
    keys = list(zip(cand["rk_c"].to_numpy().tolist(), cand["rk_r"].to_numpy().tolist(), strict=True))
    values = sim.many(keys, cfg.similarity_threshold)
    too_similar = np.array([values[k] >= cfg.similarity_threshold for k in keys], dtype=bool)
    rules["too_similar"] = int(too_similar.sum())
    cand = cand.loc[~too_similar]

    clusters = _clusters(cand, sim, cfg.dedupe_threshold)
    pk = cand["pk"].to_numpy().tolist()
    cand = cand.assign(
        cl_c=[clusters[k] for k in zip(pk, cand["rk_c"].to_numpy().tolist(), strict=True)],
        cl_r=[clusters[k] for k in zip(pk, cand["rk_r"].to_numpy().tolist(), strict=True)],
        t_pair=np.maximum(cand["t_c"].to_numpy(), cand["t_r"].to_numpy()),
    )
    cand = cand.sort_values(["t_pair", "row_c", "row_r"], kind="stable")
    dup = cand.duplicated(["pk", "cl_c", "cl_r"], keep="first").to_numpy()
    rules["duplicates"] = int(dup.sum())
    cand = cand.loc[~dup]

    ids = pd.Series(log.event_ids[cand["row_c"].to_numpy()] + "|" + log.event_ids[cand["row_r"].to_numpy()])
    cand = cand.assign(_rank=_seeded_rank(ids, cfg.seed)).sort_values(["_rank", "row_c", "row_r"], kind="stable")
    over = (cand.groupby(["u", "cc"], sort=False).cumcount() >= cfg.max_pairs_per_user_category).to_numpy()
    rules["user_category_cap"] = int(over.sum())
    cand = cand.loc[~over]
    rules["kept"] = int(len(cand))
    report["log_pairs"] = rules

    pairs = pd.DataFrame(
        {
            "prompt": log.prompts[cand["pc"].to_numpy()],
            "chosen": log.responses[cand["rc_c"].to_numpy()],
            "rejected": log.responses[cand["rc_r"].to_numpy()],
            "source": "logs",
            "category": log.categories[cand["cc"].to_numpy()],
            "user_id": log.users[cand["u"].to_numpy()],
            "chosen_event_id": _scrubbed_ids(log.event_ids[cand["row_c"].to_numpy()]),
            "rejected_event_id": _scrubbed_ids(log.event_ids[cand["row_r"].to_numpy()]),
        },
        columns=list(PAIR_COLUMNS),
    ).astype(object)
    if human_pairs is not None:
        pairs = _merge_human(pairs, _human_pairs(human_pairs, report), cfg, report)

    pairs = pairs.sort_values(
        ["source", "category", "user_id", "chosen_event_id", "rejected_event_id", "prompt", "chosen", "rejected"],
        kind="stable",
        na_position="last",
    ).reset_index(drop=True)
    report["pairs_kept"] = int(len(pairs))
    report["per_source"] = {str(k): int(v) for k, v in sorted(Counter(pairs["source"]).items())}
    report["per_category"] = {str(k): int(v) for k, v in sorted(Counter(pairs["category"]).items())}
    text = pd.concat([pairs["prompt"], pairs["chosen"], pairs["rejected"]]).astype(str)
    report["placeholders_in_pairs"] = {ph: int(text.str.count(re.escape(ph)).sum()) for ph in PLACEHOLDERS}
    report["config"] = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    return pairs, report


def _scrubbed_ids(ids: np.ndarray) -> np.ndarray:
    return scrub_series(pd.Series(ids, dtype=object)).to_numpy(dtype=object) if len(ids) else ids


# ---------------------------------------------------------------------------------------------------- human pairs


def _human_pairs(human: pd.DataFrame, report: dict[str, Any]) -> pd.DataFrame:
    missing = [c for c in HUMAN_COLUMNS if c not in human.columns]
    if missing:
        raise ValueError(f"mine_pairs: human pairs lack the columns {missing}")
    h = human.loc[:, list(HUMAN_COLUMNS)].reset_index(drop=True).astype(object)
    ok = np.ones(len(h), dtype=bool)
    for col in ("prompt", "chosen", "rejected"):
        ok &= np.array([isinstance(v, str) and v.strip() != "" for v in h[col]], dtype=bool)
    for col in ("annotator", "dimension"):
        h[col] = [v if isinstance(v, str) and v.strip() else "unknown" for v in h[col]]
    h = h.loc[ok].reset_index(drop=True)
    report["human"] = {"in": int(len(ok)), "invalid": int((~ok).sum())}
    return pd.DataFrame(
        {
            "prompt": scrub_series(h["prompt"]),
            "chosen": scrub_series(h["chosen"]),
            "rejected": scrub_series(h["rejected"]),
            "source": "human",
            "category": "human:" + scrub_series(h["dimension"]).astype(object),
            "user_id": scrub_series(h["annotator"]),
            "chosen_event_id": None,
            "rejected_event_id": None,
        },
        columns=list(PAIR_COLUMNS),
    ).astype(object)


def _merge_human(pairs: pd.DataFrame, human: pd.DataFrame, cfg: MineConfig, report: dict[str, Any]) -> pd.DataFrame:
    """Human pairs after the same similarity filter, deduplicated among themselves and against the log pairs
    (same normalised prompt, chosen and rejected)."""
    texts = np.array([normalise(t) for t in list(human["chosen"]) + list(human["rejected"])], dtype=object)
    sim = _Similarity(texts)
    n = len(human)
    keys = [(i, n + i) for i in range(n)]
    values = sim.many(keys, cfg.similarity_threshold)
    too_similar = np.array([values[k] >= cfg.similarity_threshold for k in keys], dtype=bool)
    human = human.loc[~too_similar]

    def key(df: pd.DataFrame) -> list[str]:
        return [
            f"{normalise(p).casefold()}\x00{normalise(c)}\x00{normalise(r)}"
            for p, c, r in zip(df["prompt"], df["chosen"], df["rejected"], strict=True)
        ]

    seen = set(key(pairs))
    hk = pd.Series(key(human), dtype=object)
    dup = (hk.duplicated(keep="first") | hk.isin(seen)).to_numpy(dtype=bool)
    kept = human.loc[~dup]
    report["human"] |= {"too_similar": int(too_similar.sum()), "duplicates": int(dup.sum()), "kept": int(len(kept))}
    return pd.concat([pairs, kept], ignore_index=True) if len(kept) else pairs


# ---------------------------------------------------------------------------------------------------- no pairs


def no_pairs_warning(report: dict[str, Any]) -> str | None:
    """What the console says when mining kept no pair (None when it kept some): the events used, the users per
    denoising outcome and the log pairs removed per rule, each with the ``mine`` key that decides it, and the knobs
    that would let pairs through. `report` is :func:`mine_pairs`'s."""
    if report.get("pairs_kept"):
        return None
    cfg = report.get("config", {})
    users = report.get("users", {})
    rules = report.get("log_pairs", {})
    invalid = sum(report.get("invalid_rows", {}).values())
    parts = [
        f"mine kept 0 pairs from {report.get('events_in', 0)} events ({report.get('events_used', 0)} used after "
        f"{invalid} invalid rows and {report.get('double_clicks_dropped', 0)} double clicks)"
    ]
    knobs = []
    if users.get("total"):
        parts.append(
            f"of {users['total']} users {users.get('kept', 0)} kept, {users.get('constant', 0)} constant raters "
            f"(always up or always down: no signal), {users.get('too_few_ratings', 0)} with too few ratings "
            f"(< mine.min_ratings_per_user = {cfg.get('min_ratings_per_user')} ratings that other users also rated, "
            f"mine.min_consensus_raters = {cfg.get('min_consensus_raters')}), {users.get('uninformative', 0)} "
            f"uninformative (Fisher p >= mine.alpha = {cfg.get('alpha')})"
        )
        if users.get("too_few_ratings"):
            knobs.append("lower mine.min_ratings_per_user or mine.min_consensus_raters")
        if users.get("uninformative"):
            knobs.append("raise mine.alpha")
        if not users.get("kept"):
            knobs.append("more ratings per user and per response (longer logs; simulated: simulate_logs.n_events)")
    else:
        knobs.append("the logs hold no valid event: check validate.feedback_logs and data/validated/report.md")
    removed = {k: v for k, v in rules.items() if k not in ("candidates", "kept") and v}
    if users.get("kept"):
        parts.append(
            f"{rules.get('candidates', 0)} candidate pairs (a kept user rating two responses to one prompt up and "
            "down)" + (": removed " + ", ".join(f"{k} {v}" for k, v in removed.items()) if removed else "")
        )
        rule_knobs = {
            "contradicts_consensus": "mine.consensus_margin (-1 disables it)",
            "too_similar": "mine.similarity_threshold",
            "duplicates": "mine.dedupe_threshold",
            "user_category_cap": "mine.max_pairs_per_user_category",
        }
        knobs += [
            f"raise {rule_knobs[k]}" if k != "contradicts_consensus" else f"lower {rule_knobs[k]}"
            for k in removed
            if k in rule_knobs
        ]
        if not rules.get("candidates"):
            knobs.append("the kept users never rated two answers to one prompt both ways (longer logs)")
    parts.append("to get pairs: " + "; ".join(knobs) if knobs else "see data/mined/report.json")
    return "; ".join(parts)
