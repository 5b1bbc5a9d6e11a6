from tests.bot.history import tree_fake
from worker.queue.app import app

# Registered at collection, before tests/bot's worker thread starts (a worker knows the tasks it started with).
app.task(name=tree_fake.TASK, shared=False)(tree_fake.evaluate)
