"""`tokengate worker --queues gpu --include tests.bot.fake_gpu_tasks`: this worker process runs the fake
evaluation under the pipeline's task name (the native end-to-end test; never imported by pytest itself)."""
from tests.bot.fake_evaluation import install
from worker.queue.app import app

install(app)
