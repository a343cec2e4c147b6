"""A corpus generated on the spot (no download, no network), deterministic for a seed, of any size.

English-like sentences with entities tagged in BIO form for NER, and sentences about six topics for classification.
The templates are ambiguous on purpose (names that are also places), so a model has something to learn.
A broken model shows: chance is 1/6 for TC, and a tagger that says O everywhere gets no entity right."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

ENTITY_TYPES = ("PER", "LOC", "ORG", "DATE")
TOPICS = ("sports", "business", "science", "politics", "weather", "health")

FIRST = ("Anna Maria James Olivia Liam Noah Emma Sofia Lucas Mia Ethan Amelia Mateo Chloe Arjun Priya Kenji Yuki "
         "Fatima Omar Ivan Olga Pierre Camille Diego Lucia Hans Greta Kwame Amara Chen Wei Sean Aoife Lars Ingrid "
         "Jordan Sydney Paris Florence Victoria Austin").split()
LAST = ("Smith Garcia Müller Rossi Nguyen Kim Patel Okafor Johansson Novak Dubois Silva Tanaka Kowalski Brown "
        "Martin Lopez Schmidt Ivanova Hughes Costa Larsen Haddad Mensah Fischer Moreau Sato Walsh Romero Berg "
        "Washington Lincoln Jackson Chester").split()
CITIES = ("London Berlin Madrid Rome Lisbon Oslo Nairobi Lagos Cairo Tokyo Osaka Seoul Mumbai Delhi Lima Quito "
          "Toronto Chicago Boston Denver Austin Sydney Perth Paris Florence Victoria Jordan Washington Lincoln "
          "Chester").split() + ["New York", "San Francisco", "Buenos Aires", "Rio de Janeiro", "Hong Kong",
                                "Cape Town", "Mexico City", "Kuala Lumpur"]
COUNTRIES = ("France Germany Spain Italy Portugal Norway Kenya Nigeria Egypt Japan Korea India Peru Ecuador Canada "
             "Brazil Argentina Chile Mexico Australia Vietnam Poland Sweden Ghana").split() + [
    "South Africa", "New Zealand", "the Netherlands", "the United States"]
ORGS = ["Acme Corp", "Globex", "Initech", "Umbrella Labs", "Stark Industries", "Wayne Enterprises", "Northwind Traders",
        "Contoso", "Fabrikam", "Tyrell Systems", "Cyberdyne", "Soylent Foods", "Hooli", "Pied Piper", "Vandelay Industries",
        "Oscorp", "Aperture Science", "Black Mesa", "Blue Sun", "Monarch Bank", "the World Bank", "the United Nations",
        "the Red Cross", "Greenpeace", "the City Council", "the Central Bank", "Lincoln Motors", "Jordan Airways",
        "Victoria Insurance", "Florence Partners", "Paris Mutual", "Austin Energy"]
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November December").split()

# NER templates: {PER} {LOC} {ORG} {DATE} are entity slots; other words are O.
NER_TEMPLATES = [
    "{PER} flew to {LOC} on {DATE} to meet the team from {ORG} .",
    "{ORG} will open a new office in {LOC} in {DATE} .",
    "On {DATE} , {PER} said that {ORG} had no plans to leave {LOC} .",
    "{PER} and {PER} visited {LOC} last week .",
    "The board of {ORG} named {PER} as chief executive on {DATE} .",
    "Shares of {ORG} fell after {PER} resigned .",
    "{PER} was born in {LOC} and grew up in {LOC} .",
    "Heavy rain hit {LOC} on {DATE} , said {PER} of {ORG} .",
    "{ORG} and {ORG} signed a deal in {LOC} .",
    "In {DATE} {PER} joined {ORG} as a researcher .",
    "The mayor of {LOC} , {PER} , will speak on {DATE} .",
    "Fans in {LOC} cheered as {PER} scored twice .",
    "A spokesperson for {ORG} declined to comment .",
    "{PER} told reporters in {LOC} that the talks went well .",
    "Flights from {LOC} to {LOC} resume on {DATE} .",
    "{ORG} reported strong sales in {LOC} .",
    "We met {PER} at the station in {LOC} .",
    "The new bridge in {LOC} opens on {DATE} .",
    "Nobody at {ORG} expected {PER} to win .",
    "{PER} wrote a book about {LOC} .",
    "I will call {PER} on {DATE} about the report .",
    "The concert in {LOC} was cancelled by {ORG} .",
    "{PER} from {ORG} presented the results .",
    "They moved from {LOC} to {LOC} in {DATE} .",
    "Last year {ORG} hired {PER} to lead its work in {LOC} .",
    "The weather was cold and the streets were quiet .",
    "Prices rose again this month , the report said .",
    "She said the plan would take two more years .",
]

# TC: each topic has its own words; a sentence mixes them into a shared frame.
TOPIC_WORDS = {
    "sports": ("match goal coach league season striker keeper stadium tournament final referee championship "
               "penalty team victory defeat athletes medal race marathon transfer squad fans").split(),
    "business": ("shares profit revenue market investors merger quarter earnings stock bank startup prices "
                 "inflation dividend acquisition sales customers supply growth losses company deal").split(),
    "science": ("researchers study experiment telescope molecules genome physics laboratory particles theory "
                "data galaxy cells fossil species climate-model robot algorithm discovery journal sample").split(),
    "politics": ("election minister parliament vote senator campaign policy party coalition law reform "
                 "president debate cabinet referendum opposition government treaty bill ballot voters").split(),
    "weather": ("rain storm forecast temperatures snow wind sunshine clouds flood heatwave frost thunder "
                "humidity drought hurricane showers fog ice tornado degrees gusts").split(),
    "health": ("patients hospital doctors vaccine virus treatment disease nurses clinic symptoms diet "
               "exercise therapy surgery infection medicine trial outbreak sleep diabetes blood").split(),
}
TC_FRAMES = [
    "the {a} and the {b} were the main story {when} .",
    "reports about {a} dominated the news {when} , with {b} close behind .",
    "experts discussed {a} , {b} and {c} at a meeting {when} .",
    "{when} the {a} changed everything for the {b} .",
    "many people asked about the {a} after the {b} .",
    "a new report on {a} and {c} was published {when} .",
    "the latest {a} surprised everyone who follows {b} .",
    "nobody expected the {a} to matter so much for {b} and {c} .",
    "local radio covered the {a} {when} .",
    "the {a} , the {b} and the {c} : a week to remember .",
]
WHEN = ["on Monday", "this week", "last night", "yesterday", "in the morning", "on Friday", "this year", "today"]
FILLER = ("the a of in on and to with after before about during new old big small local national early late "
          "first second major minor quiet busy").split()


@dataclass
class NerSentence:
    tokens: list[str]
    tags: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.tokens)


@dataclass
class TcSentence:
    text: str
    label: str


@dataclass
class Corpus:
    task: str
    train: list = field(default_factory=list)
    eval: list = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        if self.task == "tc":
            return list(TOPICS)
        return ["O"] + [f"{p}-{t}" for t in ENTITY_TYPES for p in ("B", "I")]


def _date(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(WEEKDAYS)
    if kind < 0.8:
        return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"
    return f"{rng.choice(MONTHS)} {rng.randint(1990, 2030)}"


def _entity(kind: str, rng: random.Random) -> str:
    if kind == "PER":
        r = rng.random()
        if r < 0.5:
            return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        return rng.choice(FIRST) if r < 0.75 else rng.choice(LAST)
    if kind == "LOC":
        return rng.choice(CITIES) if rng.random() < 0.6 else rng.choice(COUNTRIES)
    if kind == "ORG":
        return rng.choice(ORGS)
    return _date(rng)


def ner_sentence(rng: random.Random) -> NerSentence:
    tokens: list[str] = []
    tags: list[str] = []
    for part in rng.choice(NER_TEMPLATES).split():
        if part.startswith("{") and part.endswith("}"):
            kind = part[1:-1]
            words = _entity(kind, rng).split()
            # "the" in "the World Bank" is part of the name; tag it like the rest
            tokens.extend(words)
            tags.extend([f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1))
        else:
            tokens.append(part)
            tags.append("O")
    return NerSentence(tokens, tags)


def tc_sentence(rng: random.Random, noise: float = 0.15) -> TcSentence:
    label = rng.choice(TOPICS)

    def word() -> str:
        topic = rng.choice(TOPICS) if rng.random() < noise else label
        return rng.choice(TOPIC_WORDS[topic])

    frame = rng.choice(TC_FRAMES)
    text = frame.format(a=word(), b=word(), c=word(), when=rng.choice(WHEN))
    if rng.random() < 0.3:  # some filler in front, so position is not a cue
        text = " ".join(rng.choice(FILLER) for _ in range(rng.randint(1, 3))) + " " + text
    return TcSentence(text, label)


def as_examples(task: str, items) -> list[tuple[list[str], object]]:
    """Training examples: (tokens, tags) for NER, (tokens, label) for TC."""
    from gpuvs.nlp.data import tokenize

    if task == "ner":
        return [(list(s.tokens), list(s.tags)) for s in items]
    return [(tokenize(s.text), s.label) for s in items]


def generate(task: str, sentences: int = 5000, seed: int = 0, eval_fraction: float = 0.1) -> Corpus:
    """`sentences` sentences for task 'ner' or 'tc', split into train and held-out eval parts."""
    if task not in ("ner", "tc"):
        raise ValueError(f"unknown task {task!r}")
    rng = random.Random(f"{task}-{seed}")
    make = ner_sentence if task == "ner" else tc_sentence
    items = [make(rng) for _ in range(sentences)]
    n_eval = eval_size(sentences, eval_fraction)
    return Corpus(task, train=items[n_eval:] or items, eval=items[:n_eval] or items)


def steps_for(sentences: int, batch_size: int, epochs: int) -> int:
    """Optimizer steps that training on `sentences` generated sentences takes (checks before a run)."""
    return -(-(sentences - eval_size(sentences)) // batch_size) * epochs


def eval_size(sentences: int, eval_fraction: float = 0.1) -> int:
    """Sentences held out for evaluation (none below 10: then the training set is evaluated)."""
    return max(1, int(round(sentences * eval_fraction))) if sentences >= 10 else 0
