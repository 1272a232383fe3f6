// Issue 18's "Different from E2B" items through the unchanged JavaScript SDK (npm `e2b`),
// run by tests/e2e/test_parity_js.py: prints what it saw as one JSON object; the Python
// side asserts. CommonJS, so `node parity.js TAG` runs it with NODE_PATH at .npm-e2b.
const { Sandbox, TimeoutError } = require('e2b')

const bootId = async (s) =>
  (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()

async function main(tag) {
  const out = {}
  const sbx = await Sandbox.create({ timeoutMs: 600_000, metadata: { parity: tag } })
  try {
    // `startedAfter` is an inclusive bound
    const info = await sbx.getInfo()
    const page = Sandbox.list({ query: { startedAfter: info.startedAt, metadata: { parity: tag } } })
    out.listed = (await page.nextItems()).map((s) => s.sandboxId)
    out.id = sbx.sandboxId
    // a file written again loses the metadata of the earlier write
    await sbx.files.write('/home/user/f', 'a', { metadata: { k: 'v' } })
    out.metaFirst = (await sbx.files.getInfo('/home/user/f')).metadata ?? {}
    await sbx.files.write('/home/user/f', 'b')
    out.metaAfter = (await sbx.files.getInfo('/home/user/f')).metadata ?? {}
    // a snapshot is usable the moment its creation answered
    const snap = await sbx.createSnapshot()
    const copy = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
    out.fromSnapshot = await copy.files.read('/home/user/f')
    await copy.kill()
    await Sandbox.deleteSnapshot(snap.snapshotId)
    // a fork child lives as long as its parent was asked to
    const [child] = await sbx.fork({ count: 1 })
    if (child instanceof Error) throw child
    const ci = await child.getInfo()
    out.childLifeS = (ci.endAt.getTime() - ci.startedAt.getTime()) / 1000
    await child.kill()
    // setTimeout(0) applies the on-timeout action (pause, aenv's default) at once
    await sbx.setTimeout(0)
    out.afterZero = (await Sandbox.getInfo(sbx.sandboxId)).state
    // a filesystem-only pause keeps the files and boots again on resume
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    const before = await bootId(back)
    await back.pause({ keepMemory: false })
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    out.bootChanged = (await bootId(again)) !== before
    out.keptFile = await again.files.read('/home/user/f')
  } finally {
    await Sandbox.kill(sbx.sandboxId)
  }
  // the command of a killed sandbox ends as E2B's does: a TimeoutError saying it was killed
  const doomed = await Sandbox.create({ timeoutMs: 120_000 })
  const h = await doomed.commands.run('sleep 60', { background: true })
  await doomed.kill()
  try {
    await h.wait()
    out.wait = { ended: true }
  } catch (e) {
    out.wait = { name: e.constructor.name, timeout: e instanceof TimeoutError, message: String(e.message) }
  }
  return out
}

main(process.argv[2]).then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0) },
  (e) => { console.error(e); process.exit(1) },
)
