"""`tokengate worker --queues gpu --include bot.testing.fake_gpu_tasks`: this worker process runs the fake
evaluation under the pipeline's task name (the native end-to-end test; never imported by pytest itself)."""
from bot.testing.fake_evaluation import install
from worker.queue.app import app

install(app)
