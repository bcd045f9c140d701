#!/usr/bin/env python3
"""Generate the quantkit offline lm-eval task data (evals/data/*.jsonl).

All item text below was written for quantkit; nothing is copied from a
third-party dataset. The script is deterministic: the same source always
produces byte-identical JSONL files (fixed seeds, sorted inputs, no clocks).

    python scripts/build_eval_tasks.py          # rewrite evals/data/*.jsonl
    python scripts/build_eval_tasks.py --check  # exit 1 if the files on disk differ

Each JSONL row has: ``id``, ``category`` (sub-topic, for per-topic analysis),
``context`` (the full prompt, scored as-is), ``choices`` (4 strings, each scored
as " " + choice after the context) and ``label`` (index of the correct choice).
Correct-answer positions are balanced across the four slots within every task.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "evals" / "data"
SEED = 20240601

# --------------------------------------------------------------------------- helpers


def _pick(rng: random.Random, pool, k: int, exclude=()) -> list:
    """k distinct items from pool (order-stable input), none of them in exclude."""
    banned = set(exclude)
    cands = [p for p in dict.fromkeys(pool) if p not in banned]
    if len(cands) < k:
        raise ValueError(f"pool too small: need {k}, have {cands}")
    return rng.sample(cands, k)


def _finalise(task: str, items: list[dict], rng: random.Random) -> list[dict]:
    """Place each answer at a balanced, shuffled slot; add ids; sanity-check."""
    slots = [i % 4 for i in range(len(items))]
    rng.shuffle(slots)
    out, seen = [], set()
    for n, (item, slot) in enumerate(zip(items, slots)):
        answer, distractors = item.pop("answer"), list(item.pop("distractors"))
        if len(distractors) != 3 or answer in distractors or len(set(distractors)) != 3:
            raise ValueError(f"{task}: bad choices for {item}: {answer!r} {distractors!r}")
        rng.shuffle(distractors)
        choices = distractors[:slot] + [answer] + distractors[slot:]
        key = (item["context"], answer)
        if key in seen:
            raise ValueError(f"{task}: duplicate item {key!r}")
        seen.add(key)
        out.append({"id": f"{task}-{n:03d}", **item, "choices": choices, "label": slot})
    return out


# --------------------------------------------------------------------------- qk_facts

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("China", "Beijing"),
    ("Russia", "Moscow"),
    ("the United Kingdom", "London"),
    ("England", "London"),
    ("Egypt", "Cairo"),
    ("Greece", "Athens"),
    ("Portugal", "Lisbon"),
    ("Ireland", "Dublin"),
    ("Austria", "Vienna"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Denmark", "Copenhagen"),
    ("Finland", "Helsinki"),
    ("Poland", "Warsaw"),
    ("Hungary", "Budapest"),
    ("the Netherlands", "Amsterdam"),
    ("Belgium", "Brussels"),
    ("Thailand", "Bangkok"),
    ("South Korea", "Seoul"),
    ("India", "New Delhi"),
    ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Cuba", "Havana"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("the Czech Republic", "Prague"),
    ("Scotland", "Edinburgh"),
]

COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "brown", "purple", "pink"]
# (what is asked about, answer stem, answer, other colours that are also defensible -> never distractors)
COLOUR_QS = [
    ("bananas", "Bananas are", "yellow", ["green", "brown"]),
    ("carrots", "Carrots are", "orange", ["purple", "yellow"]),
    ("lemons", "Lemons are", "yellow", ["green"]),
    ("strawberries", "Strawberries are", "red", []),
    ("crows", "Crows are", "black", []),
    ("polar bears", "Polar bears are", "white", []),
    ("cucumbers", "Cucumbers are", "green", []),
    ("pumpkins", "Pumpkins are", "orange", ["yellow", "green"]),
    ("flamingos", "Flamingos are", "pink", ["orange"]),
    ("fire trucks", "Fire trucks are", "red", ["yellow"]),
    ("ripe tomatoes", "Ripe tomatoes are", "red", ["orange"]),
    ("limes", "Limes are", "green", ["yellow"]),
    ("frogs", "Frogs are", "green", ["brown"]),
    ("plums", "Plums are", "purple", ["red"]),
    ("fresh snow", "Fresh snow is", "white", []),
    ("fresh grass", "Fresh grass is", "green", []),
    ("coal", "Coal is", "black", []),
    ("milk", "Milk is", "white", []),
    ("chocolate", "Chocolate is", "brown", ["black", "white"]),
    ("the sky on a sunny day", "On a sunny day the sky is", "blue", []),
    ("blood", "Blood is", "red", []),
    ("the sea", "The sea is", "blue", ["green"]),
    ("the sun in children's drawings", "In children's drawings the sun is", "yellow", ["orange"]),
    ("coffee", "Coffee is", "brown", ["black"]),
    ("the leaves of a tree in summer", "In summer the leaves of a tree are", "green", []),
]

ANIMAL_SOUNDS = [
    ("a dog", "bark"),
    ("a cat", "meow"),
    ("a cow", "moo"),
    ("a duck", "quack"),
    ("a sheep", "baa"),
    ("a lion", "roar"),
    ("a pig", "oink"),
    ("a horse", "neigh"),
    ("an owl", "hoot"),
    ("a snake", "hiss"),
    ("a bee", "buzz"),
    ("a frog", "croak"),
    ("a mouse", "squeak"),
    ("a wolf", "howl"),
    ("a hen", "cluck"),
]

# (word, opposite)
OPPOSITES = [
    ("hot", "cold"),
    ("big", "small"),
    ("up", "down"),
    ("day", "night"),
    ("fast", "slow"),
    ("happy", "sad"),
    ("open", "closed"),
    ("light", "dark"),
    ("wet", "dry"),
    ("old", "young"),
    ("tall", "short"),
    ("full", "empty"),
    ("hard", "soft"),
    ("early", "late"),
    ("left", "right"),
    ("in", "out"),
    ("win", "lose"),
    ("rich", "poor"),
    ("strong", "weak"),
    ("clean", "dirty"),
    ("push", "pull"),
    ("loud", "quiet"),
    ("black", "white"),
    ("yes", "no"),
    ("first", "last"),
    ("good", "bad"),
    ("true", "false"),
    ("thick", "thin"),
    ("high", "low"),
    ("near", "far"),
    ("inside", "outside"),
    ("above", "below"),
    ("buy", "sell"),
    ("give", "take"),
    ("laugh", "cry"),
    ("love", "hate"),
    ("north", "south"),
    ("east", "west"),
    ("summer", "winter"),
    ("sweet", "sour"),
    ("front", "back"),
    ("alive", "dead"),
    ("boy", "girl"),
    ("king", "queen"),
    ("start", "finish"),
    ("always", "never"),
    ("heavy", "light"),
    ("wide", "narrow"),
    ("asleep", "awake"),
    ("friend", "enemy"),
]
# words that are near-synonyms of each other; an item never gets one of its answer's siblings
SYNONYMS = [
    {"short", "low", "small", "narrow", "thin", "weak", "little"},
    {"quiet", "soft"},
    {"dark", "black", "night"},
    {"light", "white", "day"},
    {"last", "finish", "end", "late"},
    {"sad", "bad", "cry"},
    {"dead", "asleep"},
    {"no", "never", "false"},
    {"take", "pull"},
    {"poor", "weak"},
    {"cold", "winter"},
]

COUNTS = ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve"]
# (counted noun, subject, number word)
COUNT_QS = [
    ("legs", "a dog", "four"),
    ("legs", "a spider", "eight"),
    ("legs", "a chicken", "two"),
    ("legs", "an insect", "six"),
    ("days", "a week", "seven"),
    ("months", "a year", "twelve"),
    ("wheels", "a bicycle", "two"),
    ("wheels", "a tricycle", "three"),
    ("wheels", "a car", "four"),
    ("sides", "a triangle", "three"),
    ("sides", "a square", "four"),
    ("fingers", "one hand", "five"),
    ("eyes", "a person", "two"),
    ("arms", "an octopus", "eight"),
    ("legs", "a cat", "four"),
    ("legs", "a person", "two"),
    ("corners", "a square", "four"),
    ("ears", "a rabbit", "two"),
    ("wings", "a bird", "two"),
    ("legs", "a horse", "four"),
]

# members of a kind, and the word that names the kind ("An apple is a kind of fruit")
KINDS = [
    (["apple", "banana", "orange", "grape", "pear", "cherry", "peach", "mango", "lemon", "strawberry"], "fruit"),
    (["dog", "horse", "cow", "lion", "tiger", "rabbit", "elephant", "sheep", "monkey", "bear"], "animal"),
    (["car", "bus", "train", "truck", "bicycle", "airplane", "boat", "ship", "motorcycle", "tractor"], "vehicle"),
    (["shirt", "hat", "coat", "sock", "dress", "jacket", "scarf", "glove", "skirt", "sweater"], "clothing"),
    (["chair", "table", "bed", "sofa", "desk", "shelf", "cupboard", "bench", "wardrobe", "stool"], "furniture"),
    (["hand", "foot", "nose", "ear", "arm", "leg", "knee", "finger", "elbow", "shoulder"], "body part"),
    (
        ["piano", "guitar", "violin", "drum", "flute", "trumpet", "harp", "cello", "banjo", "trombone"],
        "musical instrument",
    ),
    (["hammer", "saw", "drill", "wrench", "screwdriver", "shovel", "axe", "chisel", "pliers", "rake"], "tool"),
]
# distractor labels: every kind above plus two that no asked member belongs to
KIND_LABELS = [label for _, label in KINDS] + ["colour", "drink"]

# everyday knowledge: (question, answer, 3 distractors)
EVERYDAY = [
    ("What do bees make?", "honey", ["milk", "wool", "glass"]),
    ("What do cows give us to drink?", "milk", ["honey", "oil", "ink"]),
    ("Where do fish live?", "in water", ["in trees", "in the desert", "in the sky"]),
    ("What do you use to cut paper?", "scissors", ["a spoon", "a pillow", "a sock"]),
    ("What do you wear on your feet?", "shoes", ["gloves", "hats", "scarves"]),
    ("What do you wear on your hands when it is cold?", "gloves", ["shoes", "socks", "belts"]),
    ("What do you use to write on paper?", "a pen", ["a fork", "a plate", "a cup"]),
    ("What do you drink when you are thirsty?", "water", ["sand", "paper", "glue"]),
    ("What do you use to open a locked door?", "a key", ["a spoon", "a book", "a leaf"]),
    ("What shines in the sky during the day?", "the sun", ["the moon", "a lamp", "a candle"]),
    ("What falls from clouds when it rains?", "water", ["sand", "milk", "bread"]),
    ("What do birds use to fly?", "wings", ["wheels", "fins", "roots"]),
    ("What do you use to see?", "your eyes", ["your ears", "your feet", "your knees"]),
    ("What do you use to hear?", "your ears", ["your eyes", "your elbows", "your toes"]),
    ("Where do you sleep at night?", "in a bed", ["in a sink", "in an oven", "in a shoe"]),
    ("What do you use to eat soup?", "a spoon", ["a hammer", "a comb", "a brush"]),
    ("What do plants need to grow?", "water and sunlight", ["salt and sugar", "oil and smoke", "paint and glue"]),
    ("What is ice made of?", "frozen water", ["hot sand", "dry paper", "melted plastic"]),
    ("Which season is the coldest?", "winter", ["summer", "spring", "autumn"]),
    ("Which animal is known as the king of the jungle?", "the lion", ["the mouse", "the frog", "the duck"]),
    ("What do you call a baby dog?", "a puppy", ["a kitten", "a calf", "a chick"]),
    ("What do you call a baby cat?", "a kitten", ["a puppy", "a foal", "a lamb"]),
    ("Which animal has a very long neck?", "the giraffe", ["the pig", "the rabbit", "the mouse"]),
    ("Which animal has a trunk?", "the elephant", ["the cat", "the duck", "the snake"]),
    ("Which planet do we live on?", "Earth", ["Mars", "Jupiter", "Venus"]),
    ("What do we breathe?", "air", ["sand", "milk", "stone"]),
    ("What do you use to brush your teeth?", "a toothbrush", ["a hairbrush", "a fork", "a broom"]),
    ("Where do you go to borrow books?", "a library", ["a bakery", "a garage", "a swimming pool"]),
    ("Who works in a hospital and helps sick people?", "a doctor", ["a pilot", "a farmer", "a baker"]),
    ("Who flies an airplane?", "a pilot", ["a doctor", "a baker", "a teacher"]),
]


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _qa(question: str, stem: str = "") -> str:
    """'Question: ...\nAnswer: <stem>' -- restating the stem keeps a tiny LM on the answer's track."""
    return f"Question: {question}\nAnswer:" + (f" {stem}" if stem else "")


def build_facts(rng: random.Random) -> list[dict]:
    items: list[dict] = []

    def add(cat, context, answer, distractors):
        items.append({"category": cat, "context": context, "answer": answer, "distractors": distractors})

    all_caps = sorted({c for _, c in CAPITALS})
    for country, cap in CAPITALS:
        add(
            "capital",
            _qa(f"What is the capital of {country}?", f"The capital of {country} is"),
            cap,
            _pick(rng, all_caps, 3, {cap}),
        )
    for subject, stem, ans, also in COLOUR_QS:
        verb = "are" if stem.endswith(" are") else "is"
        add("colour", _qa(f"What colour {verb} {subject}?", stem), ans, _pick(rng, COLOURS, 3, {ans, *also}))
    sounds = [s for _, s in ANIMAL_SOUNDS]
    for animal, sound in ANIMAL_SOUNDS:
        add(
            "animal_sound",
            _qa(f"What sound does {animal} make?", f"{_cap(animal)} makes a"),
            sound,
            _pick(rng, sounds, 3, {sound}),
        )
    answers = [b for _, b in OPPOSITES]
    for word, opp in OPPOSITES:
        banned = {opp, word}
        for group in SYNONYMS:
            if opp in group or word in group:
                banned |= group
        add(
            "opposite",
            _qa(f"What is the opposite of {word}?", f"The opposite of {word} is"),
            opp,
            _pick(rng, answers, 3, banned),
        )
    for noun, subject, num in COUNT_QS:
        if subject.startswith("one "):
            q = f"How many {noun} are there on {subject}?"
        else:
            q = f"How many {noun} does {subject} have?"
        stem = f"{_cap(subject)} has"
        add("count", _qa(q, stem), f"{num} {noun}", [f"{d} {noun}" for d in _pick(rng, COUNTS, 3, {num})])
    for members, label in KINDS:
        for member in _pick(rng, members, 6):
            art = "an" if member[0] in "aeiou" else "a"
            add(
                "category",
                _qa(f"What is {art} {member}?", f"{_cap(art)} {member} is a kind of"),
                label,
                _pick(rng, KIND_LABELS, 3, {label}),
            )
    for q, ans, ds in EVERYDAY:
        add("everyday", _qa(q), ans, ds)
    return items


# --------------------------------------------------------------------------- qk_cloze

# sentence | answer | three clearly wrong words of the same part of speech
CLOZE = """
She poured the hot coffee into a|cup|cloud|pillow|ladder
He was thirsty, so he drank a glass of|water|sand|paper|wood
The baby was tired and fell|asleep|upward|yellow|sideways
At night we look up and see the moon and the|stars|forks|shoes|chairs
The dog wagged its|tail|roof|engine|spoon
I wear a warm coat when the weather is|cold|purple|hungry|sticky
Fish swim in the|water|oven|closet|sky
The farmer milked the|cow|tractor|fence|window
We use an umbrella when it|rains|sings|reads|laughs
She cut the bread with a sharp|knife|pillow|balloon|feather
The sun rises in the morning and sets in the|evening|kitchen|garden|pocket
He brushed his teeth with a|toothbrush|hammer|shovel|pancake
Birds build their nests in|trees|ovens|shoes|bottles
The children played in the park on a sunny|day|spoon|rock|shoe
I put the milk back in the|fridge|bathtub|mailbox|chimney
She opened the door with her|key|banana|sock|cloud
The cat chased the|mouse|moon|table|river
We bought vegetables at the|market|ocean|clouds|moon
My grandmother reads the newspaper every|morning|carrot|window|pencil
He fixed the broken chair with a hammer and some|nails|soup|clouds|songs
The ice cream melted in the hot|sun|snow|fridge|freezer
The airplane landed safely at the|airport|bathtub|library|forest
After the long run, he was very|tired|wooden|square|frozen
The teacher wrote the lesson on the|board|soup|cat|sky
You need a ticket to ride the|train|tree|cloud|mountain
The bread is baked in an|oven|ocean|envelope|umbrella
In winter the lake freezes and turns to|ice|bread|wool|paper
The flowers need sunlight and|water|plastic|noise|ink
She wrote a letter and put it in an|envelope|oven|orange|ocean
The baby drinks milk from a|bottle|brick|ladder|candle
He wiped his wet hands on a|towel|rock|candle|sandwich
Please turn off the light when you leave the|room|sky|sea|sun
A week has seven|days|trees|apples|shoes
We sat around the fire to keep|warm|blue|quiet|tall
The shop was closed, so we came back the next|day|shoe|cup|bird
She planted the seeds in the|garden|teapot|pillow|ceiling
My phone battery is empty, so I need to|charge|paint|boil|fold
He put on his socks and then his|shoes|gloves|hats|glasses
The bird flapped its wings and flew into the|sky|oven|drawer|soup
The police officer stopped the speeding|car|tree|cake|pillow
I washed the dirty dishes in the|sink|bed|wardrobe|garden
The clock on the wall shows the|time|weather|colour|smell
When I am hungry, I eat some|food|rocks|glue|paint
He combed his|hair|shoes|plate|window
The library has thousands of|books|horses|clouds|rivers
We heard the thunder and saw the|lightning|spoon|carpet|butter
The nurse gave the sick child some|medicine|bricks|nails|sand
She looked at herself in the|mirror|soup|pocket|floor
The kettle is boiling, so the water is|hot|frozen|square|purple
He climbed the ladder to reach the|roof|basement|soup|carpet
The farmer grows wheat in his|field|pocket|teacup|shoe
At the beach, the children built a castle out of|sand|milk|soup|glass
The students listened carefully to their|teacher|spoon|shoes|bread
She tied a ribbon in her|hair|soup|tea|engine
You can see your breath when the air is very|cold|loud|salty|bright
The car needs fuel, so we stopped at the gas|station|banana|pillow|cloud
He lost his glasses and could not|see|sing|swim|jump
The baker sells fresh|bread|nails|tyres|stones
The doctor listened to my heart with a|stethoscope|trumpet|shovel|broom
On my birthday I blew out the candles on the|cake|car|roof|dog
The tree lost its leaves in|autumn|soup|breakfast|traffic
A spider has eight|legs|wheels|wings|ears
The farmer feeds hay to his|horses|chairs|books|cars
The opposite of day is|night|table|green|soup
I opened the window to let in some fresh|air|rock|cheese|iron
He paid for the groceries with his|money|shadow|elbow|pillow
The mailman delivered a|letter|mountain|river|whale
She sang a|song|chair|bucket|carrot
The ship sailed across the|ocean|desert|kitchen|forest
When it snows, the ground turns|white|loud|sour|hot
The firefighters put out the|fire|moon|song|letter
My little brother is afraid of the|dark|spoon|bread|soap
The bees buzzed around the|flowers|cars|bricks|stoves
He tied the boat to the|dock|cloud|sandwich|star
I need a pencil and some paper to|write|swim|fly|sleep
The wind blew the leaves off the|trees|cups|books|spoons
Grandpa tells us a|story|shoe|bucket|carrot
A camel can walk for days across the|desert|ceiling|teacup|pillow
She fed the hungry cat a bowl of|milk|nails|sand|ink
We wear sunglasses when the sun is|bright|quiet|wooden|hungry
The train arrived at the|station|ocean|moon|sock
The boy kicked the|ball|sky|song|river
I keep my money in my|wallet|soup|sink|oven
After dinner we washed the|dishes|clouds|mountains|rivers
The glass fell on the floor and|broke|sang|grew|swam
He turned on the lamp because the room was|dark|loud|salty|sweet
She used a needle and thread to sew a|button|mountain|river|cloud
The pilot flew the|plane|river|carrot|pillow
Cows eat|grass|stones|glass|metal
The little girl hugged her teddy|bear|fork|rock|door
The soup was too hot, so I waited for it to|cool|sing|fly|read
He knocked on the|door|soup|moon|sky
The chef chopped the onions in the|kitchen|ocean|sky|desert
We went swimming in the|pool|oven|closet|library
The dentist checked my|teeth|shoes|books|windows
I use soap and water to wash my|hands|books|phone|money
The rooster crows early in the|morning|ocean|pocket|kettle
You should look both ways before you cross the|street|sky|soup|sun
The child built a snowman in the|snow|oven|bathtub|soup
My shoes are too small, so my feet|hurt|sing|fly|melt
She watered the|plants|clouds|spoons|bricks
The monkey climbed the tall|tree|soup|river|cloud
The queen lived in a big|palace|pocket|cup|shoe
We light candles when the power goes|out|green|tall|sweet
The dog buried a bone in the|garden|sky|ceiling|soup
He sharpened his|pencil|soup|cloud|river
Thick clouds covered the sun, and it started to|rain|read|sing|knit
He could not sleep because the music was too|loud|square|wooden|salty
She put on her glasses to read the|book|soup|wind|grass
The farmer collected eggs from the|chickens|clouds|chairs|rivers
I wrapped the present in colourful|paper|soup|rock|water
The bus driver opened the|doors|clouds|rivers|carrots
We wear a helmet when we ride a|bike|cloud|sandwich|river
The river flows down the mountain to the|sea|oven|closet|shoe
My hands were cold, so I put on my|gloves|socks|glasses|shoes
The child was sick and stayed home from|school|sky|soup|river
The lion is a large and dangerous|animal|vegetable|sandwich|window
In the morning I eat cereal with|milk|sand|glue|ink
He filled the bathtub with warm|water|sand|bread|rocks
The mother sang her baby to|sleep|market|roof|kitchen
She counted the coins in her|purse|soup|cloud|shoe
The stars shine brightly in the night|sky|soup|shoe|cupboard
I brush my hair with a|brush|spoon|rock|ladder
The restaurant was full of hungry|customers|clouds|bricks|rivers
Leaves are green, and the sky is|blue|loud|salty|square
The apple fell from the|tree|cloud|soup|moon
Our class went on a trip to the|zoo|soup|sock|cloud
You wear a ring on your|finger|knee|nose|elbow
When the alarm rang, she woke|up|green|soft|salty
The kite flew high in the|sky|oven|basement|sink
He poured cereal into a|bowl|shoe|pocket|cloud
The old man walked slowly with a|cane|cloud|cake|river
The heavy rain caused the river to|flood|sing|read|knit
She blew up a red|balloon|mountain|carrot|river
The squirrel gathered nuts for the|winter|kettle|ceiling|piano
We slept in a tent when we went|camping|singing|reading|knitting
The old mill wheel kept turning round and|round|square|green|salty
Please wipe your muddy feet on the|mat|moon|cloud|soup
He was late because he missed the|bus|moon|cloud|soup
The ice cube melted in my warm|hand|freezer|snow|glacier
The puppy was hungry and barked for its|food|window|ceiling|cloud
At the end of the day, the tired workers went|home|purple|salty|square
The boat floated gently on the calm|lake|toaster|pillow|carrot
I could not hear the radio, so I turned up the|volume|carpet|banana|shadow
She put the flowers in a vase full of|water|sand|nails|coins
The hungry baby started to|cry|knit|drive|paint
We need a map so that we do not get|lost|green|salty|wooden
He put a stamp on the|envelope|banana|cloud|river
In the autumn, farmers harvest their|crops|clouds|chimneys|shoes
Wash the fruit before you|eat|drive|knit|paint
The snake slid silently through the tall|grass|soup|ceiling|teacup
My sister takes photos with her|camera|pillow|spoon|carrot
The gardener cut the grass with a|lawnmower|toothbrush|teaspoon|pillow
The bread was old, so it was hard and|stale|happy|loud|musical
Before bed, my father reads me a|story|sandwich|bucket|ladder
The cold wind made her|shiver|melt|bloom|sprout
I keep my clothes folded in a|drawer|river|sandwich|cloud
The baby duck followed its|mother|carrot|window|teapot
""".strip()


def build_cloze() -> list[dict]:
    items = []
    for line in CLOZE.splitlines():
        ctx, ans, *ds = line.split("|")
        items.append({"category": "cloze", "context": ctx, "answer": ans, "distractors": ds})
    return items


# --------------------------------------------------------------------------- qk_sequence

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
NUMBER_WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"]
LETTERS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]


def _cyclic(rng, cat, seq, shown, wrap=True) -> list[dict]:
    out = []
    n = len(seq)
    starts = range(n) if wrap else range(n - shown)
    for s in starts:
        ctx = [seq[(s + i) % n] for i in range(shown)]
        ans = seq[(s + shown) % n]
        ds = _pick(rng, seq, 3, set(ctx) | {ans})
        out.append({"category": cat, "context": ", ".join(ctx) + ",", "answer": ans, "distractors": ds})
    return out


def build_sequence(rng: random.Random) -> list[dict]:
    items: list[dict] = []
    items += _cyclic(rng, "days", DAYS, 3)
    items += _cyclic(rng, "months", MONTHS, 3)
    items += _cyclic(rng, "days_short", DAYS, 2)
    # question form for months (the demo model is at chance on the same form for days, so none)
    for i, m in enumerate(MONTHS):
        ans = MONTHS[(i + 1) % 12]
        items.append(
            {
                "category": "months_question",
                "context": f"Question: What month comes after {m}?\nAnswer: The month after {m} is",
                "answer": ans,
                "distractors": _pick(rng, MONTHS, 3, {m, ans}),
            }
        )
    items += _cyclic(rng, "number_words", NUMBER_WORDS, 3, wrap=False)
    items += _cyclic(rng, "ordinals", ORDINALS, 3, wrap=False)
    items += _cyclic(rng, "letters", LETTERS, 3, wrap=False)[::2]  # A,B,C->D; C,D,E->F; ...
    # arithmetic progressions written with digits: (step, count, start range)
    specs = [
        (1, 20, (1, 90)),
        (2, 12, (2, 60)),
        (5, 10, (5, 60)),
        (10, 10, (10, 200)),
        (-1, 10, (15, 99)),
        (3, 8, (1, 40)),
        (100, 8, (100, 1500)),
    ]
    for step, count, (lo, hi) in specs:
        starts = sorted(rng.sample(range(lo, hi), count))
        if step in (5, 10, 100):
            starts = sorted({s - s % step + step for s in starts})
            while len(starts) < count:  # refill collisions deterministically
                cand = rng.randrange(lo, hi)
                cand = cand - cand % step + step
                if cand not in starts:
                    starts = sorted(starts + [cand])
        for s in starts:
            ctx = [s + step * i for i in range(4)]
            ans = s + step * 4
            wrong = [ans + step, ans - step * 2, ans + 2 * step, ans + 10, ans - 10, ans + 1]
            ds = _pick(rng, [str(w) for w in wrong if w >= 0], 3, {str(ans), *map(str, ctx)})
            items.append(
                {
                    "category": f"step{step:+d}",
                    "context": ", ".join(map(str, ctx)) + ",",
                    "answer": str(ans),
                    "distractors": ds,
                }
            )
    return items


# --------------------------------------------------------------------------- main


def build_all() -> dict[str, list[dict]]:
    tasks = {
        "qk_facts": build_facts(random.Random(SEED + 1)),
        "qk_cloze": build_cloze(),
        "qk_sequence": build_sequence(random.Random(SEED + 3)),
    }
    return {
        name: _finalise(name, items, random.Random(SEED + 100 + i)) for i, (name, items) in enumerate(tasks.items())
    }


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify files on disk instead of writing")
    args = ap.parse_args(argv)
    stale = []
    for name, rows in build_all().items():
        path = DATA_DIR / f"{name}.jsonl"
        text = render(rows)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        labels = [r["label"] for r in rows]
        print(f"{name}: {len(rows)} items, label counts {[labels.count(k) for k in range(4)]}")
    if stale:
        print("stale (re-run scripts/build_eval_tasks.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
