// vitest's configuration for E2B's own JS SDK tests (tests/e2e/e2b_suite/js-sdk, vendored
// unchanged) run against an aenv stack by tests/e2e/test_e2b_suite_js.py. It stands for
// E2B's packages/js-sdk/vitest.config.mts, less what needs a browser, msw or the SDK's
// sources: E2B's tests import the SDK as `../src` (its TypeScript sources); here every such
// import is the published npm `e2b` (2.51, .npm-e2b-suite), the client aenv is tested with,
// as the vendored Python tests run against the installed e2b wheel. Plain object, no
// imports: the file is loaded from outside the suite's node_modules.
export default {
  resolve: {
    alias: [{ find: /^(\.\.\/)+src(\/index(\.js)?)?$/, replacement: 'e2b' }],
  },
  test: {
    include: ['tests/**/*.test.ts'],
    globals: false,
    environment: 'node',
    // E2B's own figure for its sandbox tests; several set their own, longer
    testTimeout: 30_000,
    isolate: true,
    // one file at a time: the stack's VMs share CI's two cores with vitest itself
    fileParallelism: false,
    deps: { interopDefault: true },
  },
}
