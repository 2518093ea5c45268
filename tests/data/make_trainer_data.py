"""Writes the small made-up datasets the trainer tests and tiny.yaml train on.

    python tests/data/make_trainer_data.py    # rewrites samsum_tiny.jsonl and alpaca_tiny.jsonl

Every example is generated from templates with a fixed seed, so the files are reproducible; they are
short (a few hundred bytes) so the byte-level tokenizer of the `tiny` architecture packs several
into one 512-token window.
"""

from __future__ import annotations

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = [
    "Anna",
    "Ben",
    "Carla",
    "Dev",
    "Elif",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kemal",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
]
ACTIVITIES = ["lunch", "a run", "the cinema", "coffee", "board games", "the gym", "a walk", "dinner"]
PLACES = ["the station", "the park gate", "Rosa's cafe", "the library", "the old bridge", "the mall"]
TIMES = ["tomorrow at 6", "on Friday at noon", "tonight at 8", "on Sunday morning", "at 5 today"]
ITEMS = ["snacks", "the tickets", "an umbrella", "the charger", "some cake", "the map"]
WORDS = [
    ("hot", "cold"),
    ("big", "small"),
    ("fast", "slow"),
    ("early", "late"),
    ("happy", "sad"),
    ("open", "closed"),
    ("light", "dark"),
    ("full", "empty"),
    ("high", "low"),
    ("old", "new"),
]
PLURALS = [
    ("cat", "cats"),
    ("box", "boxes"),
    ("city", "cities"),
    ("child", "children"),
    ("mouse", "mice"),
    ("leaf", "leaves"),
    ("bus", "buses"),
    ("tooth", "teeth"),
    ("day", "days"),
    ("knife", "knives"),
]


def samsum(rng: random.Random) -> dict:
    a, b = rng.sample(NAMES, 2)
    act, place, when, item = rng.choice(ACTIVITIES), rng.choice(PLACES), rng.choice(TIMES), rng.choice(ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        dialogue = f"{a}: Are we still on for {act} {when}?\n{b}: Yes! Meet at {place}.\n{a}: Great, I'll bring {item}."
        summary = f"{a} and {b} meet at {place} {when} for {act}. {a} brings {item}."
    elif kind == 1:
        dialogue = (
            f"{a}: I can't make it to {act} {when}, sorry.\n{b}: No problem, next week?\n"
            f"{a}: Sure, same place, {place}."
        )
        summary = f"{a} cancels {act} {when}. They will meet at {place} next week."
    else:
        dialogue = f"{a}: Did you take {item}?\n{b}: No, I left it at {place}.\n{a}: Ok, I'll pick it up {when}."
        summary = f"{b} left {item} at {place}. {a} will pick it up {when}."
    return {"id": f"s{rng.randrange(10**6):06d}", "dialogue": dialogue, "summary": summary}


def alpaca(rng: random.Random) -> dict:
    kind = rng.randrange(4)
    if kind == 0:
        word, opposite = rng.choice(WORDS)
        return {"instruction": f"Give the opposite of the word '{word}'.", "input": "", "output": opposite}
    if kind == 1:
        word, plural = rng.choice(PLURALS)
        return {"instruction": "Write the plural of the given noun.", "input": word, "output": plural}
    if kind == 2:
        x, y = rng.randrange(10, 99), rng.randrange(10, 99)
        return {"instruction": f"Add {x} and {y}.", "input": "", "output": f"{x} + {y} = {x + y}"}
    nums = rng.sample(range(1, 50), 4)
    return {
        "instruction": "Sort these numbers in ascending order.",
        "input": ", ".join(map(str, nums)),
        "output": ", ".join(map(str, sorted(nums))),
    }


def write(name: str, make, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as fh:
        for _ in range(count):
            fh.write(json.dumps(make(rng)) + "\n")


if __name__ == "__main__":
    write("samsum_tiny.jsonl", samsum, 320, seed=1)
    write("alpaca_tiny.jsonl", alpaca, 320, seed=2)
