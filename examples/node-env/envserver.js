// What every env server in this folder shares: env.proto's tensors, a seeded random stream,
// in-stream errors, the Environment service with one env per Session, and the command line.
//
// A server supplies its spec, a function making one env and `handle(env, request)`, which
// answers one EnvRequest with one EnvResponse object or throws a RequestError.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'actorlearner', 'v1', 'env.proto');

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
// Tensors, values and spaces as env.proto defines them.
// ---------------------------------------------------------------------------------

// A float32 Tensor of shape [values.length], little-endian.
function float32Tensor(values) {
  const data = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => data.writeFloatLE(v, 4 * i));
  return { dtype: 'float32', shape: [values.length], data };
}

// A rank-0 int64 Tensor.
function int64Scalar(value) {
  const data = Buffer.alloc(8);
  data.writeBigInt64LE(BigInt(value), 0);
  return { dtype: 'int64', shape: [], data };
}

// A DictValue of a plain object: numbers become rank-0 int64 tensors, strings text.
function dictValue(object) {
  const entries = Object.entries(object).map(([key, v]) => ({
    key, value: typeof v === 'string' ? { text: v } : { tensor: int64Scalar(v) },
  }));
  return { entries };
}

// A Box space of float32 vectors with per-element bounds.
function float32Box(low, high) {
  return { box: { dtype: 'float32', shape: [low.length], low: float32Tensor(low), high: float32Tensor(high) } };
}

// A request that cannot be served; answered in the stream as EnvResponse.error.
class RequestError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// The integer of a Discrete(n) value, or a RequestError naming `what`: a rank-0 int64 tensor in 0 .. n - 1.
function decodeDiscrete(value, n, what) {
  const expected = `expected a rank-0 int64 tensor (8 bytes, little-endian) in 0..${n - 1}`;
  const tensor = value && value.kind === 'tensor' ? value.tensor : null;
  if (!tensor) {
    const got = value && value.kind ? `a ${value.kind} value` : 'no value';
    throw new RequestError(Code.INVALID_ARGUMENT, `${what}: ${expected}, got ${got}`);
  }
  const shape = tensor.shape.map(String);
  if (tensor.dtype !== 'int64' || shape.length !== 0) {
    throw new RequestError(Code.INVALID_ARGUMENT,
      `${what}: ${expected}, got dtype ${JSON.stringify(tensor.dtype)} shape [${shape.join(', ')}]`);
  }
  if (tensor.data.length !== 8) {
    throw new RequestError(Code.INVALID_ARGUMENT, `${what}: ${expected}, got ${tensor.data.length} bytes`);
  }
  const action = tensor.data.readBigInt64LE(0);
  if (action < 0n || action >= BigInt(n)) {
    throw new RequestError(Code.INVALID_ARGUMENT, `${what} ${action} is outside the action space 0..${n - 1}`);
  }
  return Number(action);
}

// The seed of a ResetRequest as a BigInt, or undefined when unset.
function seedOf(reset) {
  // proto3 `optional`: presence shows as the synthetic oneof `_seed`. Longs arrive as strings.
  return reset._seed === 'seed' ? BigInt(reset.seed) : undefined;
}

// ---------------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------------

function makeService(maxSessions, spec, newEnv, handle) {
  const sessions = new Set(); // open Session calls

  function session(call) {
    if (sessions.size >= maxSessions) {
      call.emit('error', { code: Code.RESOURCE_EXHAUSTED, details: `session cap reached (${maxSessions} open)` });
      return;
    }
    sessions.add(call);
    const env = newEnv();
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
        response = request.kind === 'close' ? { close: {} } : handle(env, request);
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
    callback(null, spec);
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

function parseArgs(argv, usage) {
  const fail = (message) => {
    console.error(`${message}\n${usage}`);
    process.exit(2);
  };
  const options = { host: '127.0.0.1', port: null, maxSessions: 16 };
  const names = { '--host': 'host', '--port': 'port', '--max-sessions': 'maxSessions' };
  for (let i = 0; i < argv.length; i++) {
    let [flag, value] = argv[i].split(/=(.*)/s);
    if (flag === '-h' || flag === '--help') {
      console.log(usage);
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

// Serves `spec`, one `newEnv()` per session answered by `handle`, as the command line says;
// prints the bound address and exits 0 on SIGTERM or SIGINT.
function runServer({ script, spec, newEnv, handle }) {
  const usage = `usage: node ${script} --port N [--host 127.0.0.1] [--max-sessions 16]`;
  const { host, port, maxSessions } = parseArgs(process.argv.slice(2), usage);
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const { Environment } = grpc.loadPackageDefinition(definition).actorlearner.v1;
  const service = makeService(maxSessions, spec, newEnv, handle);
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

module.exports = {
  Code, SplitMix64, RequestError, float32Tensor, int64Scalar, dictValue, float32Box, decodeDiscrete, seedOf,
  runServer,
};
