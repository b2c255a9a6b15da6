#!/usr/bin/env python3
"""Expected ROUGE values for the unit test `eval_summaries::tests::agrees_with_rouge_score`.

`cairn eval summaries` scores texts the way rouge-score does with `use_stemmer=True`, after
removing English stop words (the list of crates/cairn-harness/src/text.rs, read from there).
This prints, for each pair below, rouge-score's rouge1 F1 and recall, rouge2 F1 and recall,
and rougeL F1, on the same texts with the stop words removed first, as Rust tuples.

Needs: pip install rouge-score  (tested with rouge-score 0.1.2, nltk 3.10.4)
"""
import pathlib
import re

from rouge_score import rouge_scorer

TEXT_RS = pathlib.Path(__file__).resolve().parent.parent / "crates/cairn-harness/src/text.rs"
block = TEXT_RS.read_text().split("pub const STOP_WORDS")[1].split("];")[0]
STOP = set(re.findall(r'"([a-z]+)"', block))

PAIRS = [
    (
        "[2023-01-20] Jon: I lost my job as a banker, so I'm starting a dance studio.\n"
        "[2023-01-20] Gina: I lost my job at Door Dash too.",
        "Jon lost his job as a banker and planned to start a dance studio because of his "
        "passion for dancing. Gina also lost her job at Door Dash.",
    ),
    (
        "The cat chased the mouse; the mouse ran into the garden and the cat followed.",
        "A mouse ran to the garden, chased by a cat that followed it.",
    ),
    (
        "Melanie painted a sunrise in 2022 and ran a charity race for mental health on "
        "Saturday.",
        "On Saturday Melanie ran a charity race for mental health; she painted a lake "
        "sunrise last year.",
    ),
    (
        "Caroline went to an LGBTQ support group, which was powerful, and is researching "
        "adoption agencies and counseling careers.",
        "Caroline attended a support group and talked about adopting; she wants to work in "
        "counseling and mental health.",
    ),
]
# Where Porter's original algorithm (ours) and NLTK's extensions (rouge-score) group words
# differently: NLTK stems both "playing" and "playful" to "play", the original keeps
# "playful" apart ("plai" vs "play").
DIVERGENT = [("She is playing games.", "She is playful about games.")]


def strip(text):
    return " ".join(w for w in re.split(r"[^a-z0-9]+", text.lower()) if w and w not in STOP)


scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
for name, pairs in [("cases", PAIRS), ("divergent", DIVERGENT)]:
    print(f"// {name}")
    for summary, reference in pairs:
        s = scorer.score(strip(reference), strip(summary))  # score(target, prediction)
        vals = [s["rouge1"].fmeasure, s["rouge1"].recall, s["rouge2"].fmeasure,
                s["rouge2"].recall, s["rougeL"].fmeasure]
        print(f"({summary!r}, {reference!r}, " + ", ".join(f"{v:.6f}" for v in vals) + "),")
