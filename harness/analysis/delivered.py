"""One acceptance definition for every engine: tokens delivered per verify round, where every decode step
after the first token is a round.

The engines count rounds differently, so their own acceptance lengths do not compare: our engine records
every verify (an n-gram step that found no match is a round proposing 0 drafts), vLLM lists only the steps
that proposed drafts (its n-gram AL of 2.75 over 8 rounds is our 1.19 over 78), and vLLM counts the drafts
of a request's last step past the output's end (the length limit or the stop token: 35 tokens counted for
31 decoded). Both are accounting, not quality. Here both engines' records are read alike:

- a round delivers at most the tokens the output still had to take: what an engine counted past the
  output's end is not counted (`counted_past_output`), nor are the accepted drafts among it;
- the output's tokens after the first that no listed round delivered came one a step from steps that
  verified no draft (vLLM does not list them: `unlisted_steps`), each a round of one token.

Where an engine gives only totals (a wave's server counters, an older vLLM), the same two rules apply to
the totals. Two limits. In a vLLM record whose steps did not all draft (n-gram, suffix), a last drafting
step's tokens past the end can hide behind the steps it does not list (the totals cannot tell them apart);
they are then counted as such steps' tokens. And a wave's server counters pool its requests: each request's
last step may count tokens past its own end (its bonus first, then its drafts), and one request's count
past its end cancels another's unlisted steps in the sums. From pooled totals the accepted drafts and the
rounds are therefore bounds, not counts: at most `requests` bonus tokens come off the count past the end
(one a request), and the rounds may miss unlisted steps another request's overshoot hid, so AL and accept
are upper bounds (`delivered_upper_bound`); vLLM's per-request figures (served runs started with
`--per-request-spec-decode-metrics`) give the counts. Imports neither torch nor rich."""

from __future__ import annotations

LISTS_ROUNDS = ("rounds", "vllm per-step")  # acceptance sources whose records list their rounds, in order


def tokens_after_first(record: dict) -> int:
    """The output tokens the decode steps made (the first comes from the prefill)."""
    return max((record.get("output_tokens") or 0) - 1, 0)


def _figures(rounds: int, delivered: int, accepted: int, proposed: int, past: int, unlisted: int,
             bound: bool = False) -> dict:
    return {"delivered_rounds": rounds, "delivered_tokens": delivered, "delivered_accepted": accepted,
            "delivered_proposed": proposed,
            "delivered_acceptance_length": delivered / rounds if rounds else None,
            "delivered_acceptance_rate": accepted / proposed if proposed else None,
            "counted_past_output": past, "unlisted_steps": unlisted, "delivered_upper_bound": bound}


UNKNOWN = _figures(0, 0, 0, 0, 0, 0)  # (a group whose acceptance cannot be known: no figures)


def from_rounds(records: list[dict]) -> dict | None:
    """The figures of records that list their rounds (None if one does not: its rounds are not known)."""
    rounds = delivered = accepted = proposed = past = unlisted = 0
    for r in records:
        if r.get("acceptance_source", "rounds") not in LISTS_ROUNDS:  # (absent: a record from before the field)
            return None
        left, lengths = tokens_after_first(r), r.get("acceptance_lengths") or []
        for d, a, n in zip(r.get("proposal_lengths") or [], r.get("accepted_counts") or [n - 1 for n in lengths],
                           lengths):
            got = min(n, left)
            past += n - got
            left -= got
            proposed += d
            if got:  # (a round wholly past the end delivered nothing: no round of the output)
                rounds += 1
                delivered += got
                accepted += min(a, got)  # (past the end: the bonus first, then the drafts before it)
        rounds, delivered, unlisted = rounds + left, delivered + left, unlisted + left
    return _figures(rounds, delivered, accepted, proposed, past, unlisted)


def from_totals(totals: list[dict], tokens: list[int], requests: list[int]) -> dict:
    """The figures of totals (steps, draft tokens, accepted drafts), each over the `requests` requests that
    made `tokens` (their tokens after the first): the count past the output's end comes off the last steps,
    each request's bonus token first; what the steps did not deliver came from steps that drafted nothing.
    An entry pooling several requests (a wave's counters) gives bounds (the module's second limit)."""
    rounds = delivered = accepted = proposed = past = unlisted = 0
    for t, n, r in zip(totals, tokens, requests):
        steps, drafted, acc = (t.get(k) or 0 for k in ("num_spec_steps", "num_draft_tokens",
                                                       "num_accepted_draft_tokens"))
        over = max(0, steps + acc - n)
        fill = max(0, n - steps - acc)
        rounds += steps + fill
        delivered += n
        accepted += acc - max(0, over - r)
        proposed += drafted
        past += over
        unlisted += fill
    return _figures(rounds, delivered, accepted, proposed, past, unlisted, any(r > 1 for r in requests))
