"""Hand-written vocabularies of the synthetic benchmarks (private; may change)."""

from __future__ import annotations

# Single-token city names, so that a city is one TF-IDF term and one redaction target.
CITIES = (
    "Austin", "Boston", "Chicago", "Denver", "Portland", "Seattle", "Atlanta", "Phoenix", "Detroit",
    "Nashville", "Baltimore", "Milwaukee", "Sacramento", "Pittsburgh", "Cleveland", "Minneapolis", "Tucson",
    "Omaha", "Raleigh", "Albuquerque",
)

OCCUPATIONS = (
    "nurse", "electrician", "plumber", "accountant", "software engineer", "teacher", "pharmacist", "architect",
    "paramedic", "librarian", "chef", "carpenter", "dentist", "graphic designer", "veterinarian", "firefighter",
    "police officer", "lawyer", "journalist", "mechanic", "social worker", "economist", "photographer",
    "physical therapist", "welder", "baker", "data analyst", "translator", "surveyor", "optometrist",
    "flight attendant", "truck driver", "geologist", "real estate agent", "barista", "dental hygienist",
)

# Paraphrases used by the `rewrite` release (only some occupations have one).
OCCUPATION_SYNONYMS = {
    "nurse": "registered nurse", "lawyer": "attorney", "chef": "cook", "teacher": "schoolteacher",
    "software engineer": "programmer", "police officer": "cop", "journalist": "reporter",
    "veterinarian": "vet", "truck driver": "trucker", "barista": "coffee maker", "photographer": "camera operator",
    "physical therapist": "physio", "accountant": "bookkeeper", "paramedic": "medic", "mechanic": "auto technician",
    "translator": "interpreter", "data analyst": "numbers cruncher",
}

GENDERS = ("female", "male", "nonbinary")
GENDER_P = (0.48, 0.48, 0.04)
GENDER_WORD = {"female": "woman", "male": "man", "nonbinary": "nonbinary person"}
PRONOUNS = {  # subject, object, possessive, reflexive, verb agreement (is/are)
    "female": ("she", "her", "her", "herself", "is"),
    "male": ("he", "him", "his", "himself", "is"),
    "nonbinary": ("they", "them", "their", "themself", "are"),
}
DECADE_WORD = {2: "twenties", 3: "thirties", 4: "forties", 5: "fifties", 6: "sixties", 7: "seventies"}
AGE_MIN, AGE_MAX = 20, 79

KEYWORDS = (
    "gardening", "chess", "birdwatching", "kayaking", "pottery", "woodworking", "knitting", "baking", "cycling",
    "rock climbing", "photography", "astronomy", "jazz", "opera", "karaoke", "yoga", "pilates", "fishing",
    "hunting", "camping", "skiing", "snowboarding", "surfing", "sailing", "scuba diving", "tennis", "golf",
    "bowling", "poker", "crossword puzzles", "sudoku", "board games", "video games", "anime", "comic books",
    "science fiction", "mystery novels", "poetry", "calligraphy", "origami", "beekeeping", "home brewing",
    "wine tasting", "vegan cooking", "barbecue", "salsa dancing", "ballroom dancing", "tap dancing", "choir",
    "ukulele", "drumming", "vinyl records", "podcasts", "stand-up comedy", "improv theater", "film noir",
    "documentaries", "true crime", "genealogy", "local history", "urban sketching", "watercolor painting",
    "oil painting", "sculpture", "embroidery", "quilting", "running", "triathlons", "weightlifting", "boxing",
    "fencing", "archery", "horse riding", "dog training", "aquariums", "houseplants", "composting",
    "foraging", "mushroom hunting", "geocaching", "model trains", "drones", "robotics", "coding puzzles",
    "stamp collecting", "coin collecting", "antiques", "thrift shopping", "sneaker collecting", "perfume",
    "meditation", "volunteering", "church choir", "community gardening", "language exchange", "travel vlogs",
    "road trips", "motorcycles", "classic cars", "trivia nights", "escape rooms",
)

PETS = ("dog", "cat", "parrot", "rabbit", "ferret", "tortoise", "hamster", "horse", "iguana", "goat")
BREEDS = (
    "beagle", "corgi", "dachshund", "greyhound", "poodle", "labrador", "husky", "dalmatian", "sphynx cat",
    "maine coon", "siamese cat", "cockatiel", "lop rabbit", "bearded dragon", "pug", "whippet", "basenji",
)
AWARDS = ("community service", "teaching", "photography", "baking", "poetry", "volunteer", "safety",
          "innovation", "gardening", "sportsmanship")
INSTRUMENTS = ("piano", "cello", "violin", "banjo", "trumpet", "saxophone", "accordion", "harp", "mandolin",
               "clarinet")
COUNTRIES = ("Japan", "Peru", "Kenya", "Iceland", "Portugal", "Vietnam", "Morocco", "Norway", "Chile", "Greece",
             "Mongolia", "Ghana", "Nepal", "Ireland", "Argentina", "Finland", "Egypt", "Croatia", "Laos", "Bolivia")
TRAILS = ("Appalachian", "Pacific Crest", "Colorado", "Superior Hiking", "Long", "Arizona", "Ice Age",
          "John Muir", "Ozark Highlands", "Florida")
MOUNTAINS = ("Rainier", "Whitney", "Kilimanjaro", "Elbrus", "Hood", "Shasta", "Katahdin", "Olympus", "Fuji",
             "Toubkal")
DISASTERS = ("tornado", "house fire", "flood", "hurricane", "blizzard", "earthquake", "wildfire evacuation")
CAR_MODELS = ("Mustang", "Beetle", "Bel Air", "Corvette", "Land Cruiser", "Thunderbird", "Impala", "Camaro",
              "Bronco", "Cadillac")
COLORS = ("red", "blue", "green", "yellow", "silver", "black", "white", "orange", "purple", "teal")
GAMES = ("chess", "scrabble", "bridge", "table tennis", "darts", "billiards", "backgammon", "cornhole")
BRANCHES = ("Army", "Navy", "Air Force", "Coast Guard", "Marines")
UNIVERSITIES = ("Oberlin College", "Tulane University", "Purdue University", "Rice University",
                "Bowdoin College", "Gonzaga University", "Clemson University", "Drexel University",
                "Baylor University", "Creighton University")
FOODS = ("tamale", "dumpling", "empanada", "pierogi", "bagel", "taco", "crepe", "kimchi", "hot sauce", "pretzel")
STRUCTURES = ("treehouse", "greenhouse", "chicken coop", "pizza oven", "sauna", "pond", "workshop", "gazebo")
CLUBS = ("book", "chess", "cycling", "hiking", "film", "astronomy", "knitting", "running")
SPORTS = ("volleyball", "soccer", "basketball", "softball", "hockey", "lacrosse", "water polo", "rugby")
GENRES = ("mystery", "fantasy", "romance", "thriller", "historical", "horror")
NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
TATTOO_ANIMALS = ("octopus", "fox", "owl", "koi fish", "hummingbird", "wolf", "dragon", "bee", "whale", "crane")
BODY_PARTS = ("left forearm", "right shoulder", "ankle", "wrist", "back", "calf", "collarbone")
LANGUAGES = ("Icelandic", "Tagalog", "Swahili", "Welsh", "Basque", "Hungarian", "Georgian", "Yiddish", "Maori",
             "Esperanto", "Catalan", "Amharic")
COLLECTIBLES = ("snow globes", "fountain pens", "matchbooks", "vintage postcards", "pocket watches",
                "typewriters", "cast-iron pans", "teapots", "beer coasters", "hot sauce bottles", "lunch boxes",
                "cuckoo clocks")
BEVERAGES = ("ale", "cider", "kombucha", "mead", "stout", "lager")
VENUES = ("a gas station", "an airport lounge", "a hardware store", "a bowling alley", "a ferry", "a diner")

FILLERS = (
    "The weather has been unpredictable lately.",
    "Coffee is a non-negotiable morning ritual.",
    "Traffic on the way to work is a constant complaint.",
    "Weekends usually start with a long breakfast.",
    "There is always a stack of unread magazines on the kitchen table.",
    "Mondays are never easy.",
    "The neighbors are friendly but a little noisy.",
    "Phone calls with old friends happen every Sunday.",
    "Summer is the favorite season, without a doubt.",
    "Grocery shopping happens late in the evening to avoid crowds.",
    "The apartment could use a fresh coat of paint.",
    "A good night of sleep is hard to come by these days.",
    "Family dinners are a big deal at the holidays.",
    "There is a drawer full of takeout menus in the kitchen.",
    "Rainy days are for staying in and reading.",
    "The commute gives plenty of time for podcasts.",
)
# Distractor sentences: quasi-identifier values of someone else (a relative or friend).
RELATIVES = ("cousin", "brother", "sister", "best friend", "neighbor", "aunt", "uncle", "old roommate")

# ---- blog-style authors -------------------------------------------------------------------------

BLOG_INDUSTRIES = (
    "indUnk", "Student", "Education", "Technology", "Arts", "Communications-Media", "Internet", "Non-Profit",
    "Engineering", "Law", "Publishing", "Science", "Government", "Consulting", "Religion", "Fashion",
    "Marketing", "BusinessServices", "Sports-Recreation", "Banking", "Accounting", "Museums-Libraries",
    "Military", "Transportation", "HumanResources", "Construction", "Tourism", "Automotive", "Biotech",
    "Agriculture", "RealEstate", "Manufacturing", "Telecommunications", "Environment",
)
BLOG_INDUSTRY_P_HEAVY = {"indUnk": 0.3, "Student": 0.25}  # the real corpus is dominated by these two
SIGNS = ("Aries", "Taurus", "Gemini", "Cancer", "Leo", "Virgo", "Libra", "Scorpio", "Sagittarius", "Capricorn",
         "Aquarius", "Pisces")
BLOG_AGE_BANDS = ((13, 17), (23, 27), (33, 48))  # the age groups of the Blog Authorship Corpus
BLOG_AGE_BAND_P = (0.35, 0.42, 0.23)

BLOG_TOPICS: dict[str, tuple[str, ...]] = {
    "sports": ("game", "team", "score", "coach", "season", "playoffs", "fans", "league", "win", "tickets",
               "stadium", "practice", "referee", "championship", "goal", "pitcher", "quarterback", "jersey"),
    "cooking": ("recipe", "oven", "garlic", "dinner", "pasta", "soup", "kitchen", "baked", "sauce", "onions",
                "dessert", "spicy", "grill", "flour", "leftovers", "chocolate", "cookbook", "seasoning"),
    "music": ("band", "concert", "album", "song", "guitar", "lyrics", "tour", "playlist", "drummer", "gig",
              "chorus", "vinyl", "radio", "melody", "singer", "encore", "bassist", "setlist"),
    "movies": ("movie", "film", "theater", "actor", "trailer", "sequel", "director", "popcorn", "scene", "plot",
               "dvd", "premiere", "villain", "screenplay", "oscar", "matinee", "cinema", "cast"),
    "politics": ("election", "president", "vote", "senate", "campaign", "debate", "policy", "congress",
                 "candidate", "war", "protest", "taxes", "liberal", "conservative", "poll", "governor",
                 "ballot", "media"),
    "tech": ("computer", "software", "laptop", "code", "server", "website", "linux", "download", "update",
             "browser", "bug", "keyboard", "router", "windows", "program", "hardware", "install", "email"),
    "travel": ("flight", "airport", "hotel", "beach", "trip", "passport", "luggage", "vacation", "tourists",
               "map", "train", "island", "hostel", "souvenir", "border", "itinerary", "sunburn", "cruise"),
    "school": ("class", "homework", "teacher", "exam", "essay", "grades", "semester", "professor", "lecture",
               "library", "finals", "campus", "study", "quiz", "detention", "locker", "principal", "syllabus"),
    "work": ("boss", "office", "meeting", "deadline", "coworkers", "project", "shift", "paycheck", "client",
             "overtime", "manager", "cubicle", "interview", "promotion", "memo", "schedule", "resume",
             "conference"),
    "relationships": ("boyfriend", "girlfriend", "date", "love", "crush", "breakup", "kiss", "texted",
                      "jealous", "anniversary", "romantic", "flirting", "heart", "wedding", "trust", "ex",
                      "valentine", "together"),
    "gaming": ("level", "console", "boss", "quest", "multiplayer", "controller", "xbox", "playstation",
               "respawn", "guild", "loot", "raid", "nintendo", "achievement", "lag", "character", "mod",
               "speedrun"),
    "fashion": ("shoes", "dress", "jeans", "mall", "outfit", "makeup", "shopping", "jacket", "sale", "boots",
                "designer", "haircut", "earrings", "style", "sweater", "handbag", "lipstick", "wardrobe"),
    "religion": ("church", "prayer", "faith", "god", "bible", "sermon", "pastor", "worship", "soul", "blessed",
                 "youth", "retreat", "spirit", "grace", "mission", "choir", "sunday", "gospel"),
    "fitness": ("gym", "workout", "run", "miles", "diet", "weights", "muscles", "treadmill", "calories",
                "stretching", "marathon", "protein", "sore", "trainer", "cardio", "pounds", "swim", "yoga"),
    "pets": ("dog", "cat", "puppy", "kitten", "vet", "leash", "bark", "litter", "treats", "walk", "fur",
             "fetch", "adopted", "shelter", "paws", "collar", "hamster", "aquarium"),
    "books": ("book", "novel", "chapter", "author", "reading", "poem", "library", "fiction", "series",
              "paperback", "bookstore", "character", "poetry", "memoir", "plot", "sequel", "bestseller",
              "journal"),
    "cars": ("car", "engine", "highway", "tires", "mechanic", "gas", "truck", "drive", "parking", "speeding",
             "ticket", "brakes", "garage", "mileage", "radio", "sunroof", "license", "dealership"),
    "nature": ("rain", "snow", "sunset", "garden", "hiking", "trees", "storm", "lake", "mountains", "flowers",
               "camping", "birds", "river", "trail", "forest", "thunder", "spring", "autumn"),
    "money": ("rent", "bills", "budget", "bank", "loan", "savings", "credit", "debt", "broke", "salary",
              "mortgage", "stocks", "bargain", "cash", "expensive", "insurance", "refund", "allowance"),
    "art": ("painting", "sketch", "canvas", "gallery", "museum", "drawing", "colors", "photography", "sculpture",
            "exhibit", "portrait", "ink", "studio", "brushes", "design", "collage", "pottery", "crafts"),
}
# Industry -> topic it raises the preference for (the rest: no link).
INDUSTRY_TOPIC = {
    "Student": "school", "Education": "school", "Technology": "tech", "Internet": "tech", "Arts": "art",
    "Communications-Media": "movies", "Religion": "religion", "Fashion": "fashion", "Sports-Recreation": "sports",
    "Banking": "money", "Accounting": "money", "Automotive": "cars", "Tourism": "travel", "Engineering": "tech",
    "Publishing": "books", "Museums-Libraries": "books", "Environment": "nature", "Agriculture": "nature",
    "Government": "politics", "Law": "politics",
}
BLOG_FUNCTION_WORDS = (
    "i", "the", "a", "and", "to", "of", "it", "was", "so", "my", "that", "in", "me", "is", "just", "but", "for",
    "you", "on", "with", "this", "have", "like", "be", "we", "at", "really", "all", "what", "not", "today",
    "about", "get", "got", "they", "one", "out", "up", "go", "know", "think", "some", "time", "now", "been",
    "day", "well", "going", "would", "there", "when", "then", "good", "much", "night", "still", "back", "can",
    "people", "too", "do", "more", "if", "from", "lol", "anyway", "pretty", "again", "last", "week", "guess",
    "thing", "stuff", "maybe", "tomorrow", "yesterday", "totally", "feel", "love", "said", "home", "friends",
)
