"""The world's text: passage and fact sentences, question templates by relation, bridge and
comparison phrasings, and the SFT thoughts; every word here is kept out of the name pool (``entities.name_pool``)."""

from __future__ import annotations

# A passage states every fact once, the value right after a word that occurs once in the passage ("directed by",
# "for", "released in"); a thought restates a fact with the same word before the value ("Tobara was directed by
# Kerar Silix."). Reading a fact is then copying what follows a word the policy has just written, which a two-layer
# model learns in minutes; with "The director of X is V." and four "is" per passage it did not (docs/decisions/what-made-the-synthetic-world-learnable.md).
PASSAGES = {
    "person": ("{name} is {a_role} from {city}, born in {year}.", "Born in {year}, {name} is {a_role} from {city}."),
    "city": ("{name} is a city within {country}, founded in {year}.",
             "Founded in {year}, {name} is a city within {country}."),
    "film": ("{name} is a film directed by {director} for {company}, released in {year}.",
             "Released in {year}, {name} is a film directed by {director} for {company}."),
    "company": ("{name} is a company at {city}, founded by {founder} in {year}.",
                "Founded by {founder} in {year}, {name} is a company at {city}."),
}
FACT_SENTENCES = {
    "person.born_in": "{n} is from {v}.", "person.year": "{n} was born in {v}.",
    "city.country": "{n} is within {v}.", "city.year": "{n} was founded in {v}.",
    "film.director": "{n} was directed by {v}.", "film.producer": "{n} was made for {v}.",
    "film.year": "{n} was released in {v}.", "company.founder": "{n} was founded by {v}.",
    "company.based_in": "{n} is at {v}.", "company.year": "{n} was founded in {v}.",
}
# How a question names its subject entity.
SUBJECT = {"person": "{n}", "city": "{n}", "film": "the film {n}", "company": "{n}"}
# Relations: (subject type, object type or "year" / "country"). Each has question templates ({x}: the subject as a
# noun phrase) and a "need" phrase used in thoughts ("the director of Tobara").
RELATIONS: dict[str, tuple[str, str]] = {
    "film.director": ("film", "person"), "film.producer": ("film", "company"), "film.year": ("film", "year"),
    "person.born_in": ("person", "city"), "person.year": ("person", "year"),
    "company.founder": ("company", "person"), "company.based_in": ("company", "city"),
    "company.year": ("company", "year"), "city.country": ("city", "country"), "city.year": ("city", "year"),
}
QUESTIONS = {
    "film.director": ("Who directed {x}?", "Who was the director of {x}?"),
    "film.producer": ("Which company produced {x}?", "What company made {x}?"),
    "film.year": ("In which year was {x} released?", "When did {x} come out?"),
    "person.born_in": ("Where was {x} born?", "In which city was {x} born?"),
    "person.year": ("In which year was {x} born?", "When was {x} born?"),
    "company.founder": ("Who founded {x}?", "Who was the founder of {x}?"),
    "company.based_in": ("In which city is {x} based?", "Where is {x} based?"),
    "company.year": ("When was {x} founded?", "In which year was {x} founded?"),
    "city.country": ("In which country is {x}?", "Which country is {x} in?"),
    "city.year": ("When was {x} founded?", "In which year was {x} founded?"),
}
NEEDS = {
    "film.director": "the director of {n}", "film.producer": "the company behind {n}",
    "film.year": "the release year of {n}", "person.born_in": "the birthplace of {n}",
    "person.year": "the birth year of {n}", "company.founder": "the founder of {n}",
    "company.based_in": "the home city of {n}", "company.year": "the founding year of {n}",
    "city.country": "the country of {n}", "city.year": "the founding year of {n}",
}
# First hop of a bridge question, as a noun phrase ({x}: the subject), and the second hops it can take.
BRIDGES = {
    "film.director": (("the director of {x}",), ("person.born_in", "person.year")),
    "film.producer": (("the company that produced {x}", "the producer of {x}"),
                      ("company.founder", "company.based_in", "company.year")),
    "company.founder": (("the founder of {x}",), ("person.born_in", "person.year")),
    "company.based_in": (("the home city of {x}",), ("city.country", "city.year")),
    "person.born_in": (("the birthplace of {x}",), ("city.country", "city.year")),
}
COMPARE = {
    ("film", "earlier"): ("Which film came out earlier, {a} or {b}?", "Which of the films {a} and {b} was released "
                          "first?"),
    ("film", "later"): ("Which film is more recent, {a} or {b}?", "Which of the films {a} and {b} came out later?"),
    ("person", "earlier"): ("Who was born earlier, {a} or {b}?", "Which of {a} and {b} was born first?"),
    ("person", "later"): ("Who was born later, {a} or {b}?", "Which of {a} and {b} is younger?"),
    ("company", "earlier"): ("Which of {a} and {b} was founded earlier?", "Which company is older, {a} or {b}?"),
    ("company", "later"): ("Which of {a} and {b} was founded later?", "Which company is younger, {a} or {b}?"),
    ("city", "earlier"): ("Which city was founded earlier, {a} or {b}?", "Which is the older city, {a} or {b}?"),
    ("city", "later"): ("Which city was founded later, {a} or {b}?", "Which is the younger city, {a} or {b}?"),
}
YEAR_NEED = {"person": "person.year", "city": "city.year", "film": "film.year", "company": "company.year"}
TYPE_WORD = {"person": "born", "city": "city", "film": "film", "company": "company"}

# SFT thoughts (short on purpose, as in tasks/env/sft_data.py).
_OPEN = ("I need {need}. Search {n}.", "First find {need}.", "Look up {n}.")
_NEXT = ("{fact} Now I need {need}.", "{fact} Next, search {n}.")
_COMPARE_NEXT = ("{fact} Now {n}.", "{fact} Next, search {n}.")
_FINAL = ("{fact}", "{fact} So the answer is {a}.")
_COMPARE_FINAL = ("{fact} {ya} is {dir} than {yb}, so the answer is {a}.", "{fact} {a} is {dir}.")
_GENERIC = {
    "film.director": "film director", "film.producer": "film production company", "film.year": "film release year",
    "person.born_in": "birthplace", "person.year": "birth year", "company.founder": "company founder",
    "company.based_in": "company headquarters", "company.year": "company founding year",
    "city.country": "city country", "city.year": "city founding year",
}
