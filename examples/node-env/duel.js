#!/usr/bin/env node
// A two-player actorlearner environment server, written by hand against env.proto's
// multi-agent messages (AgentSpec, AgentAction, AgentStep).
//
// The game, "duel": two runners, red and blue, race on a SIZE x SIZE grid, each to its own
// beacon. They move at the same time: every step takes one action from each runner still
// racing (0 west, 1 east, 2 south, 3 north; a move into a wall stays put). -0.02 a step; a
// runner that reaches its beacon gets +1 if nobody arrived before it (+0.5 otherwise) and
// terminates: it has left, and the other runs on alone. Runners still racing after
// MAX_STEPS steps are truncated. The episode ends when both have left.
//
// Usage: node duel.js --port N [--host 127.0.0.1] [--max-sessions 16]
'use strict';

const crypto = require('crypto');
const {
  Code, SplitMix64, RequestError, float32Tensor, float32Box, dictValue, decodeDiscrete, seedOf, runServer,
} = require('./envserver');

const ENV_ID = 'node-duel-v0';
const AGENTS = ['red', 'blue'];
const SIZE = 7;
const MAX_STEPS = 30;
const NUM_ACTIONS = 4;
const MOVES = [[-1, 0], [1, 0], [0, -1], [0, 1]]; // west, east, south, north
const STEP_REWARD = -0.02;
const FIRST_REWARD = 1.0;
const SECOND_REWARD = 0.5;

// ---------------------------------------------------------------------------------
// The game: plain JavaScript, nothing gRPC-specific.
// ---------------------------------------------------------------------------------

class Duel {
  constructor() {
    // Until a seeded reset, the stream starts from fresh entropy.
    this.rng = new SplitMix64(crypto.randomBytes(8).readBigUInt64LE(0));
    this.agents = []; // the runners still racing: they act next
  }

  // seed: a BigInt, or undefined to continue the current stream. Returns one record per runner.
  reset(seed) {
    if (seed !== undefined) this.rng = new SplitMix64(seed);
    const cells = []; // red, red's beacon, blue, blue's beacon: distinct cells
    while (cells.length < 4) {
      const cell = this.rng.below(SIZE * SIZE);
      if (!cells.includes(cell)) cells.push(cell);
    }
    const xy = (cell) => [cell % SIZE, Math.floor(cell / SIZE)];
    this.position = { red: xy(cells[0]), blue: xy(cells[2]) };
    this.beacon = { red: xy(cells[1]), blue: xy(cells[3]) };
    this.steps = 0;
    this.finished = 0; // runners that reached their beacon
    this.agents = [...AGENTS];
    return this.agents.map((agent) => ({
      agent, observation: this.observation(agent), info: { distance: this.distance(agent) },
    }));
  }

  // actions: runner -> integer in 0 .. NUM_ACTIONS - 1, one for each runner still racing.
  // Returns one record per runner that was racing.
  step(actions) {
    this.steps += 1;
    const racing = this.agents;
    for (const agent of racing) {
      const [dx, dy] = MOVES[actions.get(agent)];
      const [x, y] = this.position[agent];
      this.position[agent] = [clamp(x + dx), clamp(y + dy)];
    }
    const arrived = racing.filter((agent) => this.distance(agent) === 0);
    const records = racing.map((agent) => {
      const terminated = arrived.includes(agent);
      const info = { distance: this.distance(agent) };
      if (terminated) info.result = this.finished === 0 ? 'first' : 'second';
      return {
        agent,
        observation: this.observation(agent),
        reward: terminated ? (this.finished === 0 ? FIRST_REWARD : SECOND_REWARD) : STEP_REWARD,
        terminated,
        truncated: !terminated && this.steps >= MAX_STEPS,
        info,
      };
    });
    this.finished += arrived.length;
    this.agents = records.filter((r) => !r.terminated && !r.truncated).map((r) => r.agent);
    return records;
  }

  distance(agent) {
    const [x, y] = this.position[agent];
    const [bx, by] = this.beacon[agent];
    return Math.abs(bx - x) + Math.abs(by - y);
  }

  // Own x, y, own beacon x, y, the rival's x, y, scaled to [0, 1].
  observation(agent) {
    const rival = agent === 'red' ? 'blue' : 'red';
    return [...this.position[agent], ...this.beacon[agent], ...this.position[rival]].map((v) => v / (SIZE - 1));
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
  agents: AGENTS.map((name) => ({
    name,
    observation_space: float32Box([0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]),
    action_space: { discrete: { n: NUM_ACTIONS, start: 0, dtype: 'int64' } },
  })),
  max_episode_steps: MAX_STEPS,
};

// The actions of a StepRequest as a Map, or a RequestError: exactly one per runner still racing.
function decodeActions(env, step) {
  const invalid = (message) => new RequestError(Code.INVALID_ARGUMENT, message);
  if (step.action) throw invalid('this env has several agents: a step carries actions (one per acting agent), not action');
  const actions = new Map();
  for (const { agent, action } of step.actions) {
    if (actions.has(agent)) throw invalid(`agent ${JSON.stringify(agent)} has two actions in one step`);
    if (!AGENTS.includes(agent)) throw invalid(`unknown agent ${JSON.stringify(agent)}: the agents are ${AGENTS.join(', ')}`);
    if (!env.agents.includes(agent)) {
      throw invalid(`agent ${JSON.stringify(agent)} is not to act now: the acting agents are ${env.agents.join(', ')}`);
    }
    actions.set(agent, decodeDiscrete(action, NUM_ACTIONS, `action of ${agent}`));
  }
  const missing = env.agents.filter((agent) => !actions.has(agent));
  if (missing.length) throw invalid(`no action for acting agents ${missing.join(', ')}`);
  return actions;
}

// One record of the game -> an AgentStep.
function agentStep({ agent, observation, reward = 0, terminated = false, truncated = false, info }) {
  return { agent, observation: { tensor: float32Tensor(observation) }, reward, terminated, truncated, info: dictValue(info) };
}

// One reset or step request -> one response (an EnvResponse object); throws RequestError.
function handle(env, request) {
  switch (request.kind) {
    case 'reset': {
      const records = env.reset(seedOf(request.reset)); // options are ignored
      return { reset: { agents: records.map(agentStep), live_agents: env.agents } };
    }
    case 'step': {
      if (!env.agents.length) {
        throw new RequestError(Code.FAILED_PRECONDITION, 'step needs a running episode: send reset first');
      }
      const records = env.step(decodeActions(env, request.step));
      return { step: { agents: records.map(agentStep), live_agents: env.agents } };
    }
    default:
      throw new RequestError(Code.INVALID_ARGUMENT, 'empty request: set one of reset, step or close');
  }
}

runServer({ script: 'duel.js', spec: SPEC, newEnv: () => new Duel(), handle });
