#!/usr/bin/env node
// An actorlearner environment server written by hand against proto/actorlearner/v1/env.proto.
//
// The task, "beacon": an agent on a SIZE x SIZE grid must walk to a beacon. Both start on
// random distinct cells. Actions: 0 west, 1 east, 2 south, 3 north (a move into a wall
// stays put). Reward -0.02 per step, +1 on reaching the beacon (terminated). Episodes are
// truncated after MAX_STEPS steps. The gRPC plumbing it shares with duel.js is in envserver.js.
//
// Usage: node server.js --port N [--host 127.0.0.1] [--max-sessions 16]
'use strict';

const crypto = require('crypto');
const {
  Code, SplitMix64, RequestError, float32Tensor, float32Box, decodeDiscrete, seedOf, runServer,
} = require('./envserver');

const ENV_ID = 'node-beacon-v0';
const SIZE = 7;
const MAX_STEPS = 40;
const NUM_ACTIONS = 4;
const MOVES = [[-1, 0], [1, 0], [0, -1], [0, 1]]; // west, east, south, north
const STEP_REWARD = -0.02;
const GOAL_REWARD = 1.0;
// Observation: agent x, y and beacon x, y scaled to [0, 1], then the offset
// beacon - agent scaled to [-1, 1].
const OBS_LOW = [0, 0, 0, 0, -1, -1];
const OBS_HIGH = [1, 1, 1, 1, 1, 1];

// ---------------------------------------------------------------------------------
// The environment: plain JavaScript, nothing gRPC-specific.
// ---------------------------------------------------------------------------------

class Beacon {
  constructor() {
    // Until a seeded reset, the stream starts from fresh entropy.
    this.rng = new SplitMix64(crypto.randomBytes(8).readBigUInt64LE(0));
    this.running = false;
  }

  // seed: a BigInt, or undefined to continue the current stream.
  reset(seed) {
    if (seed !== undefined) this.rng = new SplitMix64(seed);
    const cells = SIZE * SIZE;
    const agent = this.rng.below(cells);
    let beacon = this.rng.below(cells - 1);
    if (beacon >= agent) beacon += 1; // distinct from the agent's cell
    this.agent = [agent % SIZE, Math.floor(agent / SIZE)];
    this.beacon = [beacon % SIZE, Math.floor(beacon / SIZE)];
    this.steps = 0;
    this.running = true;
    return this.observation();
  }

  // action: an integer in 0 .. NUM_ACTIONS - 1; needs a running episode.
  step(action) {
    const [dx, dy] = MOVES[action];
    this.agent = [clamp(this.agent[0] + dx), clamp(this.agent[1] + dy)];
    this.steps += 1;
    const terminated = this.agent[0] === this.beacon[0] && this.agent[1] === this.beacon[1];
    const truncated = !terminated && this.steps >= MAX_STEPS;
    this.running = !terminated && !truncated;
    const reward = terminated ? GOAL_REWARD : STEP_REWARD;
    return { observation: this.observation(), reward, terminated, truncated };
  }

  observation() {
    const scale = SIZE - 1;
    const [ax, ay] = this.agent;
    const [bx, by] = this.beacon;
    return [ax / scale, ay / scale, bx / scale, by / scale, (bx - ax) / scale, (by - ay) / scale];
  }
}

function clamp(v) {
  return Math.min(SIZE - 1, Math.max(0, v));
}

// ---------------------------------------------------------------------------------
// The env's spec and its requests.
// ---------------------------------------------------------------------------------

const SPEC = {
  env_id: ENV_ID,
  observation_space: float32Box(OBS_LOW, OBS_HIGH),
  action_space: { discrete: { n: NUM_ACTIONS, start: 0, dtype: 'int64' } },
  max_episode_steps: MAX_STEPS,
};

const EMPTY_INFO = { entries: [] };

// One reset or step request -> one response (an EnvResponse object); throws RequestError.
function handle(env, request) {
  switch (request.kind) {
    case 'reset': {
      const observation = env.reset(seedOf(request.reset)); // options are ignored
      return { reset: { observation: { tensor: float32Tensor(observation) }, info: EMPTY_INFO } };
    }
    case 'step': {
      if (!env.running) {
        throw new RequestError(Code.FAILED_PRECONDITION, 'step needs a running episode: send reset first');
      }
      const result = env.step(decodeDiscrete(request.step.action, NUM_ACTIONS, 'action'));
      return {
        step: {
          observation: { tensor: float32Tensor(result.observation) },
          reward: result.reward,
          terminated: result.terminated,
          truncated: result.truncated,
          info: EMPTY_INFO,
        },
      };
    }
    default:
      throw new RequestError(Code.INVALID_ARGUMENT, 'empty request: set one of reset, step or close');
  }
}

runServer({ script: 'server.js', spec: SPEC, newEnv: () => new Beacon(), handle });
