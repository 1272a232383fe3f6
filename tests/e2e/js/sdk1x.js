// The last 1.x of the JavaScript SDK (npm `e2b` 1.13.2, unchanged), configured only with
// E2B_DOMAIN, E2B_API_KEY and NODE_EXTRA_CA_CERTS: run by tests/e2e/test_sdk1x.py, prints
// what it saw as one JSON object, with the keys of the Python SDKs' script (the Python side
// asserts both alike). CommonJS, so `node sdk1x.js` runs it with NODE_PATH at .npm-e2b-1.
const { Sandbox } = require('e2b')

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

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  const out = { id: sbx.sandboxId, host: sbx.getHost(8000) }
  try {
    out.echo = (await sbx.commands.run('echo hello from 1.x')).stdout
    await sbx.files.write('/home/user/one.txt', 'written by 1.x')
    out.read = await sbx.files.read('/home/user/one.txt')
    await sbx.commands.run(SERVE)
    out.served = await served(`https://${sbx.getHost(8000)}/index.html`)
    out.listed = (await Sandbox.list()).some((s) => s.sandboxId === sbx.sandboxId)
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
