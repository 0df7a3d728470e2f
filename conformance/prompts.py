"""Varied chat prompts: short and long, prose, code, lists, numbers, other languages."""

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain photosynthesis to a child.",
    "How do I reverse a list in Python?",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Name the planets of the solar system.",
    "Write a limerick about a cat.",
    "What does HTTP stand for?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What are the benefits of regular exercise?",
    "Write a SQL query that counts rows in a table named users.",
    "Who painted the Mona Lisa?",
    "Describe a rainbow in one sentence.",
    "What is the boiling point of water in Fahrenheit?",
    "Suggest a name for a pet turtle.",
    "How many legs does a spider have?",
    "Quelle est la couleur du ciel ?",
    "Tell me a fun fact about octopuses.",
    "What is the difference between weather and climate?",
    "Write a short motivational quote.",
]

SYSTEM_PROMPT = (
    "You are a meticulous assistant for a public library. Answer questions about opening hours, "
    "borrowing rules and events. The library opens at nine in the morning and closes at six in the "
    "evening from Monday to Friday, and it opens from ten to four on Saturdays. It is closed on "
    "Sundays and public holidays. Members may borrow up to twelve items at a time for three weeks, "
    "and they may renew each item twice unless another member has reserved it. Late returns cost "
    "ten cents per item per day, up to a maximum of five dollars per item. Children's story time "
    "takes place every Wednesday at half past ten in the reading room on the second floor. The "
    "computer lab needs a reservation, which members can make at the front desk or by phone, and "
    "each session lasts one hour. Printing costs ten cents per black and white page and fifty "
    "cents per colour page. Scanners are free to use, and members can borrow laptops for use inside "
    "the building for up to three hours. Lost cards are replaced at the front desk for two dollars. "
    "Always answer politely, briefly and accurately, and say when you do not know the answer "
    "instead of guessing."
)
