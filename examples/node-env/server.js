#!/usr/bin/env node
// An actorlearner environment server written by hand against proto/actorlearner/v1/env.proto.
//
// The task, "beacon": an agent on a SIZE x SIZE grid must walk to a beacon. Both start on
// random distinct cells. Actions: 0 west, 1 east, 2 south, 3 north (a move into a wall
// stays put). Reward -0.02 per step, +1 on reaching the beacon (terminated). Episodes are
// truncated after MAX_STEPS steps.
//
// Usage: node server.js --port N [--host 127.0.0.1] [--max-sessions 16]
'use strict';

const crypto = require('crypto');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'actorlearner', 'v1', 'env.proto');

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

const { status: Code } = grpc;

// ---------------------------------------------------------------------------------
// A seeded random stream: splitmix64 over BigInt, so any int64 seed is used in full.
// ---------------------------------------------------------------------------------

const MASK64 = (1n << 64n) - 1n;

class SplitMix64 {
  constructor(seed) {
    this.state = BigInt.asUintN(64, seed);
  }

  next() {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
    return z ^ (z >> 31n);
  }

  // An integer in 0 .. n - 1 (the modulo bias is below 1e-17 for small n).
  below(n) {
    return Number(this.next() % BigInt(n));
  }
}

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
// Tensors and spaces as env.proto defines them.
// ---------------------------------------------------------------------------------

// A float32 Tensor of shape [values.length], little-endian.
function float32Tensor(values) {
  const data = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => data.writeFloatLE(v, 4 * i));
  return { dtype: 'float32', shape: [values.length], data };
}

const SPEC = {
  env_id: ENV_ID,
  observation_space: {
    box: { dtype: 'float32', shape: [OBS_LOW.length], low: float32Tensor(OBS_LOW), high: float32Tensor(OBS_HIGH) },
  },
  action_space: { discrete: { n: NUM_ACTIONS, start: 0, dtype: 'int64' } },
  max_episode_steps: MAX_STEPS,
};

// A request that cannot be served; answered in the stream as EnvResponse.error.
class RequestError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// The action as an integer, or a RequestError: the spec asks for a rank-0 int64 tensor.
function decodeAction(value) {
  const expected = `expected a rank-0 int64 tensor (8 bytes, little-endian) in 0..${NUM_ACTIONS - 1}`;
  const tensor = value && value.kind === 'tensor' ? value.tensor : null;
  if (!tensor) {
    const got = value && value.kind ? `a ${value.kind} value` : 'no value';
    throw new RequestError(Code.INVALID_ARGUMENT, `action: ${expected}, got ${got}`);
  }
  const shape = tensor.shape.map(String);
  if (tensor.dtype !== 'int64' || shape.length !== 0) {
    throw new RequestError(Code.INVALID_ARGUMENT,
      `action: ${expected}, got dtype ${JSON.stringify(tensor.dtype)} shape [${shape.join(', ')}]`);
  }
  if (tensor.data.length !== 8) {
    throw new RequestError(Code.INVALID_ARGUMENT, `action: ${expected}, got ${tensor.data.length} bytes`);
  }
  const action = tensor.data.readBigInt64LE(0);
  if (action < 0n || action >= BigInt(NUM_ACTIONS)) {
    throw new RequestError(Code.INVALID_ARGUMENT, `action ${action} is outside the action space 0..${NUM_ACTIONS - 1}`);
  }
  return Number(action);
}

// ---------------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------------

const EMPTY_INFO = { entries: [] };

// One request -> one response (an EnvResponse object); throws RequestError.
function handle(env, request) {
  switch (request.kind) {
    case 'reset': {
      const reset = request.reset;
      // proto3 `optional`: presence shows as the synthetic oneof `_seed`. Longs arrive as strings.
      const seed = reset._seed === 'seed' ? BigInt(reset.seed) : undefined;
      const observation = env.reset(seed); // options are ignored
      return { reset: { observation: { tensor: float32Tensor(observation) }, info: EMPTY_INFO } };
    }
    case 'step': {
      if (!env.running) {
        throw new RequestError(Code.FAILED_PRECONDITION, 'step needs a running episode: send reset first');
      }
      const result = env.step(decodeAction(request.step.action));
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
    case 'close':
      return { close: {} };
    default:
      throw new RequestError(Code.INVALID_ARGUMENT, 'empty request: set one of reset, step or close');
  }
}

function makeService(maxSessions) {
  const sessions = new Set(); // open Session calls

  function session(call) {
    if (sessions.size >= maxSessions) {
      call.emit('error', { code: Code.RESOURCE_EXHAUSTED, details: `session cap reached (${maxSessions} open)` });
      return;
    }
    sessions.add(call);
    const env = new Beacon();
    let open = true;
    const finish = () => {
      if (!open) return;
      open = false;
      sessions.delete(call); // the env is plain data: dropping it frees it
    };

    call.on('data', (request) => {
      if (!open) return;
      let response;
      try {
        response = handle(env, request);
      } catch (err) {
        const code = err instanceof RequestError ? err.code : Code.INTERNAL;
        response = { error: { code, message: err.message } };
      }
      const closing = request.kind === 'close';
      // Stop reading while the client is not reading its responses.
      if (!call.write(response) && !closing) {
        call.pause();
        call.once('drain', () => call.resume());
      }
      if (closing) {
        finish();
        call.end();
      }
    });
    call.on('end', () => { // the client half-closed: end the stream too
      if (open) {
        finish();
        call.end();
      }
    });
    call.on('cancelled', finish); // the client cancelled or vanished
    call.on('error', finish);
    call.on('close', finish);
  }

  function getSpec(_call, callback) {
    callback(null, SPEC);
  }

  // Ends every open session with UNAVAILABLE (used on shutdown).
  function endAll() {
    for (const call of sessions) {
      call.emit('error', { code: Code.UNAVAILABLE, details: 'environment server shutting down' });
    }
  }

  return { handlers: { GetSpec: getSpec, Session: session }, endAll };
}

// ---------------------------------------------------------------------------------
// Command line.
// ---------------------------------------------------------------------------------

const USAGE = 'usage: node server.js --port N [--host 127.0.0.1] [--max-sessions 16]';

function parseArgs(argv) {
  const options = { host: '127.0.0.1', port: null, maxSessions: 16 };
  const names = { '--host': 'host', '--port': 'port', '--max-sessions': 'maxSessions' };
  for (let i = 0; i < argv.length; i++) {
    let [flag, value] = argv[i].split(/=(.*)/s);
    if (flag === '-h' || flag === '--help') {
      console.log(USAGE);
      process.exit(0);
    }
    if (!(flag in names)) fail(`unknown argument ${argv[i]}`);
    if (value === undefined) {
      if (i + 1 >= argv.length) fail(`${flag} needs a value`);
      value = argv[++i];
    }
    options[names[flag]] = value;
  }
  if (options.port === null) fail('--port is required (0 picks a free port)');
  const port = Number(options.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) fail(`--port must be 0..65535, got ${options.port}`);
  const maxSessions = Number(options.maxSessions);
  if (!Number.isInteger(maxSessions) || maxSessions < 1) {
    fail(`--max-sessions must be a positive integer, got ${options.maxSessions}`);
  }
  return { host: options.host, port, maxSessions };
}

function fail(message) {
  console.error(`${message}\n${USAGE}`);
  process.exit(2);
}

function main() {
  const { host, port, maxSessions } = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const { Environment } = grpc.loadPackageDefinition(definition).actorlearner.v1;
  const service = makeService(maxSessions);
  const server = new grpc.Server();
  server.addService(Environment.service, service.handlers);

  const address = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
  server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err, boundPort) => {
    if (err) {
      console.error(`cannot listen on ${address}: ${err.message}`);
      process.exit(1);
    }
    console.log(`env server listening on ${host}:${boundPort}`);
  });

  let stopping = false;
  const shutdown = () => {
    if (stopping) process.exit(0); // a second signal: do not wait
    stopping = true;
    service.endAll();
    server.tryShutdown(() => process.exit(0));
    setTimeout(() => {
      server.forceShutdown();
      process.exit(0);
    }, 5000).unref();
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);
}

main();
