"""Environment construction from a name, shared by actors, the evaluator and the learner."""

from actorlearner.envs.factory import make_env, make_vector_env

__all__ = ["make_env", "make_vector_env"]
