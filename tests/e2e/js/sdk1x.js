// The last 1.x of the JavaScript SDK (npm `e2b` 1.13.2, unchanged), configured only with
// E2B_DOMAIN, E2B_API_KEY and NODE_EXTRA_CA_CERTS: run by tests/e2e/test_sdk1x.py, prints
// what it saw as one JSON object, with the keys of the Python SDKs' script (the Python side
// asserts both alike). CommonJS, so `node --experimental-websocket sdk1x.js WS_SERVER_FILE`
// runs it with NODE_PATH at .npm-e2b-1 (Node 20's WebSocket client is behind that flag).
const fs = require('fs')
const { Sandbox } = require('e2b')

const WS_PORT = 8765

const SERVE =
  'mkdir -p /tmp/www && echo served to 1.x > /tmp/www/index.html && ' +
  'cd /tmp/www && python3 -m http.server 8000 >/dev/null 2>&1 &'

// the guest's server starts in the background: fetched until it answers (30 s at most)
async function served(url) {
  const deadline = Date.now() + 30_000
  for (;;) {
    try {
      const r = await fetch(url) // NODE_EXTRA_CA_CERTS: Node trusts the stack's CA
      const body = await r.text()
      if (r.status === 200 || Date.now() > deadline) return [r.status, body]
    } catch (e) {
      if (Date.now() > deadline) return [0, String(e)]
    }
    await new Promise((ok) => setTimeout(ok, 500))
  }
}

// one text message to the guest's echo server over wss:// by name: [status line, whether
// the handshake was accepted, the reply], as the Python script reports it
function wsEcho(host) {
  return new Promise((resolve) => {
    const ws = new WebSocket(`wss://${host}/chat`)
    const done = setTimeout(() => resolve(['timeout', false, null]), 30_000)
    ws.onopen = () => ws.send('hello over wss')
    ws.onmessage = (ev) => {
      clearTimeout(done)
      ws.close(1000)
      resolve(['HTTP/1.1 101 Switching Protocols', true, String(ev.data)])
    }
    ws.onerror = (ev) => {
      clearTimeout(done)
      resolve(['error', false, String(ev.message || ev)])
    }
  })
}

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, secure: true })
  const out = { id: sbx.sandboxId, host: sbx.getHost(8000) }
  try {
    out.echo = (await sbx.commands.run('echo hello from 1.x')).stdout
    await sbx.files.write('/home/user/one.txt', 'written by 1.x')
    out.read = await sbx.files.read('/home/user/one.txt')
    await sbx.commands.run(SERVE)
    out.served = await served(`https://${sbx.getHost(8000)}/index.html`)
    out.listed = (await Sandbox.list()).some((s) => s.sandboxId === sbx.sandboxId)
    // file URLs by name, signed (the sandbox is secure)
    out.down = await sbx.downloadUrl('/home/user/one.txt')
    const r = await fetch(out.down)
    out.got = [r.status, await r.text()]
    const form = new FormData()
    form.append('file', new Blob(['uploaded by 1.x']), 'up.txt')
    const up = await fetch(await sbx.uploadUrl('/home/user/up.txt'), { method: 'POST', body: form })
    out.posted = up.status
    out.uploaded = await sbx.files.read('/home/user/up.txt')
    await sbx.files.write('/tmp/ws.py', fs.readFileSync(process.argv[2], 'utf8'))
    await sbx.commands.run('python3 /tmp/ws.py', { background: true })
    await sbx.commands.run(
      `for i in $(seq 100); do ss -ltn | grep -q :${WS_PORT} && break; sleep 0.1; done`
    )
    out.ws_host = sbx.getHost(WS_PORT)
    out.wss = await wsEcho(out.ws_host)
  } finally {
    await sbx.kill()
  }
  out.killed_again = await Sandbox.kill(sbx.sandboxId) // false: it is gone
  out.listed_after = (await Sandbox.list()).some((s) => s.sandboxId === sbx.sandboxId)
  console.log(JSON.stringify(out))
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
