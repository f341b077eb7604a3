// Lists what a template change would replace or delete among stateful resources.
// Uses @aws-cdk/cloudformation-diff, the library behind `cdk diff`, which knows
// from the CloudFormation spec which property changes force a replacement.
//
//   node tools/destructive_changes.mjs BEFORE.json AFTER.json
//
// Prints a JSON list of {logicalId, type, impact}; exits 1 when it is not empty.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { fullDiff, ResourceImpact } = require("@aws-cdk/cloudformation-diff");

// Losing one of these loses a cluster, its network or its GPUs' placement
// (the list is shared with tools/dev/review.py's logical-id record).
const STATEFUL_TYPES = JSON.parse(readFileSync(new URL("./stateful_types.json", import.meta.url), "utf8"));
const DESTRUCTIVE = new Set([
  ResourceImpact.WILL_REPLACE,
  ResourceImpact.MAY_REPLACE,
  ResourceImpact.WILL_DESTROY,
  ResourceImpact.WILL_ORPHAN,
]);

const [before, after] = process.argv.slice(2).map((path) => JSON.parse(readFileSync(path, "utf8")));
const diff = fullDiff(before, after);
const found = [];
diff.resources.forEachDifference((logicalId, change) => {
  const type = change.oldResourceType ?? change.newResourceType;
  if (STATEFUL_TYPES.includes(type) && DESTRUCTIVE.has(change.changeImpact)) {
    found.push({ logicalId, type, impact: change.changeImpact });
  }
});
console.log(JSON.stringify(found, null, 2));
process.exit(found.length ? 1 : 0);
